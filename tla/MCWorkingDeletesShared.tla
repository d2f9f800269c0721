------------------------- MODULE MCWorkingDeletesShared -------------------------
(***************************************************************************)
(* MUST FAIL (NoDanglingWorkingInv).  A database that deletes a file a     *)
(* retained checkpoint still references (issue 18).                        *)
(*                                                                         *)
(* The buggy R102: when a database stops using a file it wrote, its        *)
(* attempt deletes it unless a snapshot or a pending checkpoint refers to  *)
(* it, as if it still owned every file it wrote once its checkpoints were  *)
(* done (ForSt's "the DB deletes a file at ref count 0" without "only if   *)
(* it still owns it"; the upload backend's belief that a completed         *)
(* checkpoint holds a copy).  A compaction after a completed checkpoint    *)
(* then deletes the file the retained checkpoint refers to in place: I1    *)
(* breaks (and I5: the file was the coordinator's).                        *)
(*                                                                         *)
(* Differs from MCWorkingState only in what a drop deletes.                *)
(***************************************************************************)
EXTENDS MCWorkingState

BugDead(t, f) ==
    {g \in exists : creator[g] = t /\ g \notin uses[t] \ {f} /\ g \notin Pinned(t)
                    /\ g \notin PendingRefs}

BugNext ==
    \/ \E s \in Subs, t \in Tms, f \in Fids : DropWith(t, s, f, BugDead(t, f))
    \/ \E s \in Subs, t \in Tms : WriteWorking(t, s)
    \/ Trigger
    \/ \E s \in Subs, t \in Tms, c \in Cks : SnapshotWorking(t, s, c)
    \/ \E s \in Subs, c \in Cks : Acknowledge(s, c)
    \/ \E c \in Cks : Complete(c) \/ Abort(c)
    \/ CollectWorking
    \/ \E s \in Subs : CrashTm(s)
    \/ Failover
    \/ \E t \in Tms : AttemptStopped(t)
    \/ \E c \in Cks, p \in RescalePars, m \in Modes : Restore(c, p, m)

BugSpec == Init /\ [][Bounded(BugNext)]_vars
===================================================================================
