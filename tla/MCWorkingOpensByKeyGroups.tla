--------------------- MODULE MCWorkingOpensByKeyGroups ---------------------
(***************************************************************************)
(* MUST FAIL (OwnOperatorInv).  A restore that opens a database on every   *)
(* file of the checkpoint whose key groups overlap its own, whatever the   *)
(* operator that wrote it (issue 38).                                      *)
(*                                                                         *)
(* The buggy R105: failover and restore open by key groups alone           *)
(* (OpenedByKeyGroups).  With two operators that keep working state (a     *)
(* window and a join) at one parallelism, their subtasks cover the same    *)
(* key groups, so after a failover the window's database opens the join's *)
(* files too: the wrong data, and pins that keep another operator's files  *)
(* alive.                                                                  *)
(*                                                                         *)
(* Differs from MCWorkingState only in how a database opens.               *)
(***************************************************************************)
EXTENDS MCWorkingState

BugNext ==
    \/ \E s \in Subs, t \in Tms : WriteWorking(t, s)
    \/ \E s \in Subs, t \in Tms, f \in Fids : DropWorking(t, s, f)
    \/ Trigger
    \/ \E s \in Subs, t \in Tms, c \in Cks : SnapshotWorking(t, s, c)
    \/ \E s \in Subs, c \in Cks : Acknowledge(s, c)
    \/ \E c \in Cks : Complete(c) \/ Abort(c)
    \/ CollectWorking
    \/ \E s \in Subs : CrashTm(s)
    \/ FailoverWith(OpenedByKeyGroups)
    \/ \E t \in Tms : AttemptStopped(t)
    \/ \E c \in Cks, p \in RescalePars, m \in Modes : RestoreWith(c, p, m, OpenedByKeyGroups)

BugSpec == Init /\ [][Bounded(BugNext)]_vars
===================================================================================
