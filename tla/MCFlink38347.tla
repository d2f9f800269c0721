------------------------------- MODULE MCFlink38347 -------------------------------
(***************************************************************************)
(* MUST FAIL (NoDanglingInv).  FLINK-38347: the TM tracked a managed       *)
(* directory with a reference COUNTER instead of the set of checkpoint     *)
(* ids that used it (R41).                                                 *)
(*                                                                         *)
(* The same buggy rule as test_flink_38347_buggy_rule_is_caught in         *)
(* tests/test_flink_bugs.py (Flink's DirectoryHandleWithReference-         *)
(* Track before the fix): +1 per checkpoint that reported the directory,   *)
(* -1 per abort notification the TM hears, tracking stops once the TM      *)
(* hears a completion; at a count <= 0 the TM deletes the directory with   *)
(* everything in it.  With checkpoint 1's completion notices lost and      *)
(* checkpoint 2 aborted, the abort brings the count to 0 and the TM        *)
(* deletes the directory that the retained checkpoint 1 uses: I1 breaks.   *)
(*                                                                         *)
(* Differs from MCCheckpointOwnership only in the abort handler: the       *)
(* delivery of an abort notice runs CounterRelease instead of ReleaseDirs  *)
(* (R41), with two ghost counters of its own.                              *)
(***************************************************************************)
EXTENDS MCCheckpointOwnership

(***************************************************************************)
(* abortsHeard: abort notices each TM has heard (duplicates count);        *)
(* completeHeard: the TMs that have heard a completion notice.             *)
(***************************************************************************)
VARIABLES abortsHeard, completeHeard

bugVars == <<vars, abortsHeard, completeHeard>>

(***************************************************************************)
(* The buggy R41: count = |usedBy| - aborts heard (this one included).     *)
(***************************************************************************)
CounterRelease(s, t) ==
    LET doomed == {d \in DOMAIN s.dirs :
                      /\ s.dirs[d].creator = t
                      /\ t \notin completeHeard
                      /\ Cardinality(s.dirs[d].usedBy) <= abortsHeard[t] + 1}
    IN  FoldSet(LAMBDA x, d : DeleteDir(x, d, t), s, doomed)

CounterAbort(s, t, c, L) == CounterRelease(TmAbortCore(s, t, c, L), t)

(***************************************************************************)
(* Delivery with the counter rule.                                         *)
(***************************************************************************)
CounterDeliver(n) ==
    LET heard == n.tm \in DOMAIN tms /\ tms[n.tm].status # "stopped"
    IN  /\ n \in DOMAIN channel
        /\ Goto(DeliverWith(st, n, CounterAbort))
        /\ abortsHeard' = IF heard /\ n.kind = "abort"
                          THEN [abortsHeard EXCEPT ![n.tm] = @ + 1] ELSE abortsHeard
        /\ completeHeard' = IF heard /\ n.kind = "complete"
                            THEN completeHeard \cup {n.tm} ELSE completeHeard

BugInit ==
    /\ Init
    /\ abortsHeard = [t \in 1..MaxTm |-> 0]
    /\ completeHeard = {}

BugNext ==
    \/ /\ \/ SmallTrigger
          \/ SmallWriteAck
          \/ SmallReuseAck
          \/ SmallCoordinator
          \/ SmallLoss
          \/ SmallCrash
          \/ SmallRestore
       /\ UNCHANGED <<abortsHeard, completeHeard>>
    \/ \E n \in DOMAIN channel : CounterDeliver(n)

BugSpec == BugInit /\ [][Bounded(BugNext)]_bugVars
===================================================================================
