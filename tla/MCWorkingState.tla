---------------------------- MODULE MCWorkingState ----------------------------
(***************************************************************************)
(* Model-checking wrapper of WorkingState.tla: its steps through the same  *)
(* depth bound as MCCheckpointOwnership's (Bounded: a state MaxMoves moves *)
(* deep has no successor; see "The depth bound" in tla/README.md).         *)
(***************************************************************************)
EXTENDS WorkingState, TLC

CONSTANT MaxMoves

Bounded(A) == TLCGet("level") <= MaxMoves /\ A

BoundedSpec == Init /\ [][Bounded(Next)]_vars
===================================================================================
