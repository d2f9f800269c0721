---------------------- MODULE MCWorkingRescaleDropsOldDir ----------------------
(***************************************************************************)
(* MUST FAIL (NoDanglingWorkingInv).  A rescale that deletes an old        *)
(* working directory a retained checkpoint still refers to (issue 18).     *)
(*                                                                         *)
(* The buggy collection: beside what R104 collects, the coordinator drops  *)
(* each working directory of an earlier job once no live database uses a   *)
(* file in it and every file in it is the coordinator's: the database      *)
(* directory delete of SPEC.md section 11's SlateDB table ("no live        *)
(* database writes or uses a file of") without its "no retained            *)
(* checkpoint names".  After a CLAIM restore that rescales 2 -> 1, the new *)
(* database stops using (compacts away) a file of an old subtask's         *)
(* directory while the claimed checkpoint, retained until the new job's    *)
(* first one completes, still refers to it; the next collection deletes    *)
(* that directory: I1 breaks.  A NO_CLAIM restore leaves the old           *)
(* directories the user's, which this collection spares.                   *)
(*                                                                         *)
(* Differs from MCWorkingState only in what a collection deletes; its      *)
(* config lets a restore only rescale (RescalePars = {1}).                 *)
(***************************************************************************)
EXTENDS MCWorkingState

Dir(f) == <<fjob[f], origin[f]>>

InDir(d) == {f \in exists : Dir(f) = d}

OldDirsUnused ==
    {d \in {Dir(f) : f \in {g \in exists : fjob[g] < job}} :
        InDir(d) \cap LiveUses = {} /\ \A f \in InDir(d) : owner[f] = Coord}

BugNext ==
    \/ CollectWith(Collectable \cup UNION {InDir(d) : d \in OldDirsUnused})
    \/ \E s \in Subs, t \in Tms : WriteWorking(t, s)
    \/ \E s \in Subs, t \in Tms, f \in Fids : DropWorking(t, s, f)
    \/ Trigger
    \/ \E s \in Subs, t \in Tms, c \in Cks : SnapshotWorking(t, s, c)
    \/ \E s \in Subs, c \in Cks : Acknowledge(s, c)
    \/ \E c \in Cks : Complete(c) \/ Abort(c)
    \/ \E s \in Subs : CrashTm(s)
    \/ Failover
    \/ \E t \in Tms : AttemptStopped(t)
    \/ \E c \in Cks, p \in RescalePars, m \in Modes : Restore(c, p, m)

BugSpec == Init /\ [][Bounded(BugNext)]_vars
===================================================================================
