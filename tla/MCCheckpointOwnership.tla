----------------------------- MODULE MCCheckpointOwnership -----------------------------
(***************************************************************************)
(* Model-checking wrapper for CheckpointOwnership.                         *)
(*                                                                         *)
(* SmallSpec mirrors the moves of model_tests/explore.py (the offline      *)
(* breadth-first search of the reference model), so that the small TLA+    *)
(* model and `python -m model_tests.explore --bound small` explore the     *)
(* same bounded space:                                                     *)
(*  - a subtask's write (or reuse) and its acknowledgement are one move    *)
(*    (explore's moves), of the "sst" state, for a pending checkpoint;     *)
(*  - Complete once every subtask acknowledged, Abort of any pending one;  *)
(*  - deliver / drop any notification, duplicate while fewer than          *)
(*    MaxChannel are in flight;                                            *)
(*  - with Crashes: CrashTm or ReplaceTm of the lowest live TM when none   *)
(*    is lost, AttemptStopped of a lost one, Failover when one is lost;    *)
(*  - with MaxJob > 1: a CLAIM Restore of the latest retained checkpoint   *)
(*    to each parallelism of RescalePars, from the first job only.         *)
(* MaxMoves bounds the depth as explore's max_depth does: every spec of   *)
(* this wrapper takes its steps through Bounded, which allows a move only  *)
(* from a state fewer than MaxMoves moves from the initial one, so TLC     *)
(* generates, counts and checks exactly the states explore does (run with  *)
(* -workers 1, so that a state is first reached at its least depth).  The *)
(* parts are named so that a must-fail model can swap one of them.         *)
(***************************************************************************)
EXTENDS CheckpointOwnership, TLC

(***************************************************************************)
(* MaxMoves: explore's max_depth (moves from the initial state).           *)
(***************************************************************************)
CONSTANT MaxMoves

(***************************************************************************)
(* Crashes: explore's "crashes" bound: whether TM crashes, stops and       *)
(* failovers are in play.                                                  *)
(***************************************************************************)
CONSTANT Crashes

(***************************************************************************)
(* Bounded(A): A, taken from a state at most MaxMoves - 1 moves deep.      *)
(* In the next-state relation TLCGet("level") is the level of the state    *)
(* being expanded, and the initial state is level 1.  A guard here, not a  *)
(* CONSTRAINT: TLC checks, but does not count, a successor that fails a    *)
(* constraint, so a constraint either counts one level short of explore    *)
(* or checks one level past it.  States MaxMoves deep have no successor:   *)
(* the dead end of the bound, which is why deadlock is not checked.        *)
(***************************************************************************)
Bounded(A) == TLCGet("level") <= MaxMoves /\ A

(***************************************************************************)
(* Write (or reuse) and acknowledge, as one move (explore's moves()).      *)
(***************************************************************************)
WriteAck(i, c) ==
    LET t == placement[i]
    IN  /\ c \in DOMAIN pending
        /\ WriterOk(st, t, i, c, FALSE)
        /\ ~HasOutput(st, t, i, c)
        /\ Goto(DoAck(DoWrite(st, t, i, c), t, i, c, FALSE))

ReuseAckWith(i, c, Reuse(_, _, _, _)) ==
    LET t == placement[i]
    IN  /\ c \in DOMAIN pending
        /\ WriterOk(st, t, i, c, FALSE)
        /\ ~HasOutput(st, t, i, c)
        /\ i \in DOMAIN backend[t]
        /\ Goto(DoAck(Reuse(st, t, i, c), t, i, c, FALSE))

ReuseAck(i, c) == ReuseAckWith(i, c, DoReuse)

(***************************************************************************)
(* The parts of SmallNext.                                                 *)
(***************************************************************************)
SmallTrigger == Trigger

SmallWriteAck == \E i \in DOMAIN placement, c \in Ckpts : WriteAck(i, c)

SmallReuseAck == \E i \in DOMAIN placement, c \in Ckpts : ReuseAck(i, c)

SmallCoordinator == \E c \in DOMAIN pending : Complete(c) \/ Abort(c)

SmallDeliver == DeliverNext

SmallLoss == LossNext

SmallCrash ==
    /\ Crashes
    /\ running
    /\ \/ /\ LostTms(st) = {}
          /\ CurrentTms(st) # {}
          /\ CrashTm(MinOf(CurrentTms(st)))
       \/ /\ LostTms(st) = {}
          /\ CurrentTms(st) # {}
          /\ ReplaceTm(MinOf(CurrentTms(st)))
       \/ \E t \in LostTms(st) : AttemptStopped(t)
       \/ /\ LostTms(st) # {}
          /\ Failover

SmallRestore ==
    /\ job = 1
    /\ retained # {}
    /\ \E p \in RescalePars :
          Restore((CHOOSE r \in retained : \A x \in retained : r.id >= x.id).id, p, "CLAIM")

SmallNext ==
    \/ SmallTrigger
    \/ SmallWriteAck
    \/ SmallReuseAck
    \/ SmallCoordinator
    \/ SmallDeliver
    \/ SmallLoss
    \/ SmallCrash
    \/ SmallRestore

(***************************************************************************)
(* SmallSpec: the explore-like model (MCSmall*.cfg, MCMedium.cfg).         *)
(* SoakSpec: Next, every command, within the same depth bound (MCSoak).    *)
(***************************************************************************)
SmallSpec == Init /\ [][Bounded(SmallNext)]_vars

SoakSpec == Init /\ [][Bounded(Next)]_vars
=========================================================================================
