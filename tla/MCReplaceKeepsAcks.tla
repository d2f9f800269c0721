----------------------------- MODULE MCReplaceKeepsAcks -----------------------------
(***************************************************************************)
(* MUST FAIL (NoDanglingInv).  Task-level failover (R66) that keeps the    *)
(* replaced attempt's acknowledgements of pending checkpoints instead of   *)
(* withdrawing them.                                                       *)
(*                                                                         *)
(* Subtask 0's TM acknowledges checkpoint 1 and is replaced (a Spark task  *)
(* retried after the ack was sent, say) while 1 is pending.  Kept, its     *)
(* acknowledgement still counts: subtask 1 acknowledges, 1 completes and   *)
(* names the replaced attempt's segment.  If that attempt is known stopped *)
(* before the completion, the coordinator has taken its files and deleted  *)
(* what no retained checkpoint referred to then (R64), that segment's file *)
(* among them: the completed checkpoint dangles.  R66 withdraws the        *)
(* acknowledgement, so the completion waits for the new attempt's.         *)
(*                                                                         *)
(* Differs from MCCheckpointOwnership only in the replacement: ReplaceTm   *)
(* goes through DoReplaceTmWith with a withdrawal that withdraws nothing.  *)
(***************************************************************************)
EXTENDS MCCheckpointOwnership

(***************************************************************************)
(* The buggy R66: the replaced attempt's acknowledgements stay.            *)
(***************************************************************************)
KeepAcks(s, I) == s

KeepingReplace(t) ==
    /\ running
    /\ t \in CurrentTms(st)
    /\ nextTm <= MaxTm
    /\ Goto(DoReplaceTmWith(st, t, KeepAcks))

BugCrash ==
    /\ Crashes
    /\ running
    /\ \/ /\ LostTms(st) = {}
          /\ CurrentTms(st) # {}
          /\ CrashTm(MinOf(CurrentTms(st)))
       \/ /\ LostTms(st) = {}
          /\ CurrentTms(st) # {}
          /\ KeepingReplace(MinOf(CurrentTms(st)))
       \/ \E t \in LostTms(st) : AttemptStopped(t)
       \/ /\ LostTms(st) # {}
          /\ Failover

BugNext ==
    \/ SmallTrigger
    \/ SmallWriteAck
    \/ SmallReuseAck
    \/ SmallCoordinator
    \/ SmallDeliver
    \/ SmallLoss
    \/ BugCrash
    \/ SmallRestore

BugSpec == Init /\ [][Bounded(BugNext)]_vars
=====================================================================================
