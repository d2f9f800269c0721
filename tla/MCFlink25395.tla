------------------------------- MODULE MCFlink25395 -------------------------------
(***************************************************************************)
(* MUST FAIL (NoDanglingInv).  FLINK-25395: shared state of a checkpoint   *)
(* that was not confirmed complete was reused; the checkpoint was then     *)
(* aborted, its files discarded, and the later checkpoint that reused      *)
(* them lost its data.                                                     *)
(*                                                                         *)
(* The same buggy rule as test_flink_25395_buggy_rule_is_caught in         *)
(* tests/test_flink_bugs.py: Flink before both fixes, i.e. R20             *)
(* without the "known completed" test (FLINK-25395) AND R21 without the    *)
(* lastUsed advance (FLINK-35570).  Broken R20 alone is masked in merging  *)
(* modes by R21 (the reused segment outlives the abort of its checkpoint)  *)
(* and without merging by R22 (a placeholder whose entry is gone aborts    *)
(* the checkpoint), exactly as in the Python twin.                         *)
(*                                                                         *)
(* Differs from MCCheckpointOwnership only in the reuse move: ReuseAck     *)
(* reuses through UnconfirmedReuse instead of DoReuse.                     *)
(***************************************************************************)
EXTENDS MCCheckpointOwnership

(***************************************************************************)
(* The buggy R20: the confirmed flag is not looked at.                     *)
(***************************************************************************)
ReusableUnconfirmed(s, t, ref) == Reusable(s, t, [ref EXCEPT !.confirmed = TRUE])

(***************************************************************************)
(* The buggy R20 + R21: reuse unconfirmed state, do not advance lastUsed.  *)
(***************************************************************************)
UnconfirmedReuse(s, t, i, c) == DoReuseWith(s, t, i, c, ReusableUnconfirmed, FALSE)

BugNext ==
    \/ SmallTrigger
    \/ SmallWriteAck
    \/ \E i \in DOMAIN placement, c \in Ckpts : ReuseAckWith(i, c, UnconfirmedReuse)
    \/ SmallCoordinator
    \/ SmallDeliver
    \/ SmallLoss
    \/ SmallCrash
    \/ SmallRestore

BugSpec == Init /\ [][Bounded(BugNext)]_vars
===================================================================================
