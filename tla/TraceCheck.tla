------------------------------- MODULE TraceCheck -------------------------------
(***************************************************************************)
(* Trace validation: is a command trace that fastimpl logged (NDJSON,      *)
(* fastimpl/trace.py) a behaviour of CheckpointOwnership?                  *)
(*                                                                         *)
(* model_tests/trace_tla.py turns a trace into TraceLog, a sequence of     *)
(* records [cmd, i, c, t, n, p, mode, retain] (the subtask index, the      *)
(* checkpoint, the attempt's TM, ..., 0 where a field does not apply), and *)
(* into a config that sets the constants from the trace's Config and       *)
(* JobSpec.  Only the commands the store accepted are in TraceLog: a       *)
(* refused command changed nothing.  The trace must lie inside the spec's  *)
(* abstraction (one vertex, one piece of keyed shared state per subtask,   *)
(* no storage faults, no coordinator restart); the converter refuses any   *)
(* other trace and says why.                                               *)
(*                                                                         *)
(* TraceNext takes the action named by the next record.  Where the trace   *)
(* does not say which notice a command meant (fastimpl numbers the notices *)
(* in flight by their position in its own queue; the spec keeps them in a  *)
(* bag), any notice in flight is tried: TLC explores every reading.        *)
(*                                                                         *)
(* The trace is a behaviour of the spec iff some reachable state has       *)
(* consumed the whole log.  TraceIncomplete is the invariant "the log is   *)
(* not consumed yet": TLC reporting it VIOLATED is the witness that the    *)
(* trace is accepted (each MCTrace config says "expect: violates           *)
(* TraceIncomplete"); TLC finishing without an error means no reading of   *)
(* the trace is a behaviour of the spec.  The safety invariants are        *)
(* checked along the way.                                                  *)
(***************************************************************************)
EXTENDS CheckpointOwnership, Sequences, TLC

CONSTANT TraceLog

VARIABLE pos

traceVars == <<vars, pos>>

TraceInit ==
    /\ Init
    /\ pos = 0

(***************************************************************************)
(* The action for one record of the log.                                   *)
(***************************************************************************)
Replay(e) ==
    \/ e.cmd = "Trigger" /\ Trigger
    \/ e.cmd = "WriteState" /\ e.t = 0 /\ WriteState(e.i, e.c)
    \/ e.cmd = "WriteState" /\ e.t # 0 /\ ZombieWrite(e.t, e.i, e.c)
    \/ e.cmd = "ReuseShared" /\ ReuseShared(e.i, e.c)
    \/ e.cmd = "Acknowledge" /\ e.t = 0 /\ Acknowledge(e.i, e.c)
    \/ e.cmd = "Acknowledge" /\ e.t # 0 /\ ZombieAck(e.t, e.i, e.c)
    \/ e.cmd = "Decline" /\ Decline(e.i, e.c)
    \/ e.cmd = "Complete" /\ Complete(e.c)
    \/ e.cmd = "Abort" /\ Abort(e.c)
    \/ e.cmd = "DeliverNotification" /\ \E n \in DOMAIN channel : DeliverNotification(n)
    \/ e.cmd = "DropNotification" /\ \E n \in DOMAIN channel : DropNotification(n)
    \/ e.cmd = "DuplicateNotification" /\ \E n \in DOMAIN channel : DuplicateNotification(n)
    \/ e.cmd = "CrashTm" /\ CrashTm(e.t)
    \/ e.cmd = "AttemptStopped" /\ AttemptStopped(e.t)
    \/ e.cmd = "CrashDuringWrite" /\ CrashDuringWrite(e.i, e.c)
    \/ e.cmd = "Failover" /\ Failover
    \/ e.cmd = "ReplaceTm" /\ ReplaceTm(e.t)
    \/ e.cmd = "Restore" /\ Restore(e.c, e.p, e.mode)
    \/ e.cmd = "Cancel" /\ Cancel(e.retain)

TraceNext ==
    /\ pos < Len(TraceLog)
    /\ Replay(TraceLog[pos + 1])
    /\ pos' = pos + 1

TraceSpec == TraceInit /\ [][TraceNext]_traceVars

(***************************************************************************)
(* Violated exactly when a behaviour has replayed the whole log.           *)
(***************************************************************************)
TraceIncomplete == pos < Len(TraceLog)
===================================================================================
