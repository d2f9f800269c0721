---------------------------- MODULE MCFailoverNewestOnly ----------------------------
(***************************************************************************)
(* MUST FAIL (NoDanglingInv).  Safe cleanup after failover computed        *)
(* against the restored (newest) checkpoint alone instead of every         *)
(* retained checkpoint (R61, R62; FLIP-306 §4.8 "best effort" cleanup).    *)
(*                                                                         *)
(* With num-retained = 2, checkpoint 1 keeps a file that checkpoint 2      *)
(* dropped.  A restarting TM that keeps only the newest checkpoint's       *)
(* segments takes checkpoint 1's file for garbage and deletes it, while    *)
(* checkpoint 1 is still retained: I1 breaks.  The Python counterpart is   *)
(* the rule test test_r61_segments_of_all_retained_checkpoints_are_kept    *)
(* (tests/test_rules_ownership_failover.py); the swapped rule here         *)
(* is _restore_manager with `keep` computed from retained[-1] only.        *)
(*                                                                         *)
(* Differs from MCCheckpointOwnership only in the failover move: Failover  *)
(* restarts each TM with NewestOnly instead of RestoreManager.             *)
(***************************************************************************)
EXTENDS MCCheckpointOwnership

(***************************************************************************)
(* The buggy R61: keep only the newest retained checkpoint's segments.     *)
(***************************************************************************)
NewestOnly(s, t) ==
    RestoreManagerKeep(s, t, IF s.retained = {} THEN {}
                             ELSE {CHOOSE r \in s.retained : \A x \in s.retained : r.id >= x.id})

NewestOnlyFailover ==
    /\ running
    /\ nextTm + Cardinality({t \in PlacedTms(st) : tms[t].status # "alive"}) - 1 <= MaxTm
    /\ Goto(DoFailoverWith(st, NewestOnly))

BugCrash ==
    /\ Crashes
    /\ running
    /\ \/ /\ LostTms(st) = {}
          /\ CurrentTms(st) # {}
          /\ CrashTm(MinOf(CurrentTms(st)))
       \/ \E t \in LostTms(st) : AttemptStopped(t)
       \/ /\ LostTms(st) # {}
          /\ NewestOnlyFailover

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
