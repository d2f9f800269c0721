------------------------------ MODULE WorkingState ------------------------------
(***************************************************************************)
(* Who owns a working file of disaggregated state, and who may delete it:  *)
(* R100-R106 and I7 of spec/SPEC.md (section 11), the TLA+ twin of the     *)
(* working-state part of refimpl/machine.py (write_working, drop_working,  *)
(* _db_release, snapshot_working, acknowledge, collect_working,            *)
(* _open_databases).                                                       *)
(*                                                                         *)
(* What the abstraction drops (the rest of the store is                    *)
(* CheckpointOwnership.tla's):                                             *)
(*  - one vertex; each subtask runs on its own TM attempt, so a database   *)
(*    is named by its attempt; attempt ids are 1..MaxTm;                   *)
(*  - a snapshot refers to every file in place: the small files R103       *)
(*    uploads as merged segments are CheckpointOwnership's segments;      *)
(*  - notifications are immediate: completing or aborting a checkpoint     *)
(*    drops every attempt's unacknowledged snapshot of it at once;         *)
(*  - no restore to a new job: failover opens the files in place (R105)    *)
(*    as CLAIM does, and NO_CLAIM and rescale are in refimpl and its       *)
(*    tests only; no storage faults, no savepoints;                        *)
(*  - files are ids 1..MaxFile, written whole (R101).                      *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

(***************************************************************************)
(* NumSub: subtasks 1..NumSub.  MaxTm: attempt ids 1..MaxTm (the first     *)
(* NumSub start alive).  MaxFile: working file ids 1..MaxFile.             *)
(* MaxCheckpoint: checkpoint ids 1..MaxCheckpoint.  NumRetained:           *)
(* execution.checkpointing.num-retained.  Coord: the coordinator, a model  *)
(* value.                                                                  *)
(***************************************************************************)
CONSTANTS NumSub, MaxTm, MaxFile, MaxCheckpoint, NumRetained, Coord

Subs == 1..NumSub
Tms == 1..MaxTm
Fids == 1..MaxFile
Cks == 1..MaxCheckpoint

VARIABLES
    status,     \* [Tms -> {"none", "alive", "lost", "stopped"}]
    host,       \* [Subs -> Tms]: the subtask's current attempt
    hosted,     \* [Tms -> SUBSET Subs]: what a lost attempt hosted (R64, R106)
    uses,       \* [Tms -> SUBSET Fids]: the files each attempt's database uses
    exists,     \* the working files on storage
    owner,      \* [Fids -> Tms \cup {Coord}]
    creator,    \* [Fids -> Tms]
    origin,     \* [Fids -> Subs]: the subtask whose database wrote it
    shared,     \* files an acknowledgement referred to (R100, R103)
    pins,       \* [Tms -> [Cks -> SUBSET Fids]]: unacknowledged snapshots (R103)
    pending,    \* pending checkpoint ids
    acks,       \* [Cks -> SUBSET Subs]
    refs,       \* [Cks -> SUBSET Fids]: what each checkpoint's acknowledgements refer to
    retained,   \* retained checkpoint ids
    nextCk, nextFile, nextTm,
    deferred,   \* coordinator deletes waiting for a lost creator to stop (R64)
    deleted,    \* ghost: every deleted file id
    badDeletes, \* ghost: deletes that broke I2 or I5
    clean       \* ghost: the last step was a collection in a quiet state (I6)

vars == <<status, host, hosted, uses, exists, owner, creator, origin, shared, pins,
          pending, acks, refs, retained, nextCk, nextFile, nextTm, deferred, deleted,
          badDeletes, clean>>

(***************************************************************************)
(* R100: a database is live while its attempt is alive and hosts its       *)
(* subtask; a lost attempt's database is a zombie.  A file is private      *)
(* (owner its attempt, not shared, pinned by no snapshot), pinned, or      *)
(* shared (the coordinator's for good).                                    *)
(***************************************************************************)
Live(t) == status[t] = "alive" /\ \E s \in Subs : host[s] = t

(***************************************************************************)
(* R104: what keeps a shared file: a live database's use, a retained       *)
(* checkpoint's reference, a pending checkpoint's acknowledgement.         *)
(***************************************************************************)
LiveUses == UNION {uses[t] : t \in {x \in Tms : Live(x)}}

RetainedRefs == UNION {refs[c] : c \in retained}

PendingRefs == UNION {refs[c] : c \in pending}

(***************************************************************************)
(* R102, R103: what an attempt's unacknowledged snapshots pin.             *)
(***************************************************************************)
Pinned(t) == UNION {pins[t][c] : c \in Cks}

(***************************************************************************)
(* Helpers.                                                                *)
(***************************************************************************)
Max(S) == CHOOSE x \in S : \A y \in S : y <= x
Min(S) == CHOOSE x \in S : \A y \in S : x <= y

(***************************************************************************)
(* A delete: recorded in the ghosts; breaks I2 (gone already) or I5 (the   *)
(* actor is not the owner) in badDeletes.                                  *)
(***************************************************************************)
Delete(F, actor) ==
    /\ badDeletes' = badDeletes \cup
         {<<f, actor>> : f \in {g \in F : g \notin exists \/ owner[g] # actor}}
    /\ exists' = exists \ F
    /\ deleted' = deleted \cup F

(***************************************************************************)
(* R102: an attempt deletes its private files that its database does not   *)
(* use and no unacknowledged snapshot of it refers to.  Garbage(t, u, p)   *)
(* is that set given its uses u and pins p.                                *)
(***************************************************************************)
Garbage(t, u, p) ==
    {f \in exists : owner[f] = t /\ f \notin shared /\ f \notin u /\ f \notin p}

(***************************************************************************)
(* The types of the variables, and the initial state: the first NumSub     *)
(* attempts alive, one per subtask, no file, no checkpoint.                *)
(***************************************************************************)
TypeOK ==
    /\ status \in [Tms -> {"none", "alive", "lost", "stopped"}]
    /\ host \in [Subs -> Tms]
    /\ uses \in [Tms -> SUBSET Fids]
    /\ exists \subseteq Fids /\ shared \subseteq Fids
    /\ owner \in [Fids -> Tms \cup {Coord}]
    /\ pins \in [Tms -> [Cks -> SUBSET Fids]]
    /\ pending \subseteq Cks /\ retained \subseteq Cks

Init ==
    /\ status = [t \in Tms |-> IF t <= NumSub THEN "alive" ELSE "none"]
    /\ host = [s \in Subs |-> s]
    /\ hosted = [t \in Tms |-> {}]
    /\ uses = [t \in Tms |-> {}]
    /\ exists = {} /\ shared = {}
    /\ owner = [f \in Fids |-> Coord]
    /\ creator = [f \in Fids |-> 1]
    /\ origin = [f \in Fids |-> 1]
    /\ pins = [t \in Tms |-> [c \in Cks |-> {}]]
    /\ pending = {} /\ retained = {}
    /\ acks = [c \in Cks |-> {}]
    /\ refs = [c \in Cks |-> {}]
    /\ nextCk = 1 /\ nextFile = 1 /\ nextTm = NumSub + 1
    /\ deferred = {} /\ deleted = {} /\ badDeletes = {}
    /\ clean = FALSE

(***************************************************************************)
(* R101, R106: a database writes a whole file, private to its attempt: the *)
(* live one of subtask s, or a zombie (a lost attempt that hosted s).      *)
(***************************************************************************)
Acting(t, s) == (host[s] = t /\ status[t] = "alive") \/ (status[t] = "lost" /\ s \in hosted[t])

WriteWorking(t, s) ==
    /\ Acting(t, s)
    /\ nextFile <= MaxFile
    /\ LET f == nextFile IN
       /\ exists' = exists \cup {f}
       /\ owner' = [owner EXCEPT ![f] = t]
       /\ creator' = [creator EXCEPT ![f] = t]
       /\ origin' = [origin EXCEPT ![f] = s]
       /\ uses' = [uses EXCEPT ![t] = @ \cup {f}]
    /\ nextFile' = nextFile + 1
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, shared, pins, pending, acks, refs, retained,
                   nextCk, nextTm, deferred, deleted, badDeletes>>

(***************************************************************************)
(* R102: a database stops using a file; its attempt deletes what became    *)
(* its garbage.  A shared file is never the database's to delete.          *)
(***************************************************************************)
DropDelete(t, f) == Garbage(t, uses[t] \ {f}, Pinned(t))

DropWith(t, s, f, Dead) ==
    /\ Acting(t, s)
    /\ f \in uses[t]
    /\ uses' = [uses EXCEPT ![t] = @ \ {f}]
    /\ Delete(Dead, t)
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, owner, creator, origin, shared, pins, pending,
                   acks, refs, retained, nextCk, nextFile, nextTm, deferred>>

DropWorking(t, s, f) == DropWith(t, s, f, DropDelete(t, f))

(***************************************************************************)
(* R50: the coordinator starts the next checkpoint.                        *)
(***************************************************************************)
Trigger ==
    /\ nextCk <= MaxCheckpoint
    /\ pending' = pending \cup {nextCk}
    /\ nextCk' = nextCk + 1
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, exists, owner, creator, origin, shared,
                   pins, acks, refs, retained, nextFile, nextTm, deferred, deleted,
                   badDeletes>>

(***************************************************************************)
(* R103: a snapshot refers to every file the database uses, in place: a    *)
(* pin of its attempt until the acknowledgement.  A zombie may snapshot    *)
(* too (its acknowledgement is ignored, R56).                              *)
(***************************************************************************)
SnapshotWorking(t, s, c) ==
    /\ Acting(t, s)
    /\ c \in pending
    /\ s \notin acks[c]
    /\ pins' = [pins EXCEPT ![t][c] = @ \cup uses[t]]
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, exists, owner, creator, origin, shared,
                   pending, acks, refs, retained, nextCk, nextFile, nextTm, deferred,
                   deleted, badDeletes>>

(***************************************************************************)
(* R103: the live attempt's acknowledgement hands what it refers to in     *)
(* place to the coordinator, for good; its pins go (R102).                 *)
(***************************************************************************)
Acknowledge(s, c) ==
    LET t == host[s]
        F == pins[t][c] \cap exists
        p2 == [pins EXCEPT ![t][c] = {}]
    IN
    /\ status[t] = "alive"
    /\ c \in pending
    /\ s \notin acks[c]
    /\ shared' = shared \cup F
    /\ owner' = [f \in Fids |-> IF f \in F THEN Coord ELSE owner[f]]
    /\ refs' = [refs EXCEPT ![c] = @ \cup F]
    /\ acks' = [acks EXCEPT ![c] = @ \cup {s}]
    /\ pins' = p2
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, exists, creator, origin, pending, retained,
                   nextCk, nextFile, nextTm, deferred, deleted, badDeletes>>

(***************************************************************************)
(* Pins of checkpoints that finished go (immediate notifications), and     *)
(* each live attempt deletes what became its garbage (R102).               *)
(***************************************************************************)
DropPins(C) ==
    [t \in Tms |-> [c \in Cks |-> IF c \in C /\ status[t] = "alive" THEN {} ELSE pins[t][c]]]

FinishGarbage(C) ==
    LET p2 == DropPins(C)
    IN UNION {Garbage(t, uses[t], UNION {p2[t][x] : x \in Cks})
              : t \in {x \in Tms : status[x] = "alive"}}

(***************************************************************************)
(* R51-R53: completion retains c, subsumes the oldest beyond NumRetained   *)
(* (R104: that only releases references) and aborts older pending ones.    *)
(***************************************************************************)
Complete(c) ==
    /\ c \in pending
    /\ acks[c] = Subs
    /\ LET kept == retained \cup {c}
           r2 == IF Cardinality(kept) > NumRetained THEN kept \ {Min(kept)} ELSE kept
           done == {x \in pending : x <= c}
       IN /\ retained' = r2
          /\ pending' = pending \ done
          /\ pins' = DropPins(done)
          /\ exists' = exists \ FinishGarbage(done)
          /\ deleted' = deleted \cup FinishGarbage(done)
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, owner, creator, origin, shared, acks, refs,
                   nextCk, nextFile, nextTm, deferred, badDeletes>>

Abort(c) ==
    /\ c \in pending
    /\ pending' = pending \ {c}
    /\ pins' = DropPins({c})
    /\ exists' = exists \ FinishGarbage({c})
    /\ deleted' = deleted \cup FinishGarbage({c})
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, owner, creator, origin, shared, acks, refs,
                   retained, nextCk, nextFile, nextTm, deferred, badDeletes>>

(***************************************************************************)
(* R104: the coordinator's collection.  A file a lost attempt wrote waits  *)
(* for it to stop (R64).  I6's ghost: a collection in a quiet state.       *)
(***************************************************************************)
Collectable ==
    {f \in exists : f \in shared /\ owner[f] = Coord /\ f \notin RetainedRefs
                    /\ f \notin PendingRefs /\ f \notin LiveUses}

Quiet == pending = {} /\ \A t \in Tms : status[t] # "lost"

CollectWorking ==
    LET waits == {f \in Collectable : status[creator[f]] = "lost"}
        now == Collectable \ waits
    IN /\ Delete(now, Coord)
       /\ deferred' = deferred \cup waits
       /\ clean' = Quiet
       /\ UNCHANGED <<status, host, hosted, uses, owner, creator, origin, shared, pins,
                      pending, acks, refs, retained, nextCk, nextFile, nextTm>>

(***************************************************************************)
(* R57: a lost attempt aborts every pending checkpoint; it may go on as a  *)
(* zombie (R106).                                                          *)
(***************************************************************************)
CrashTm(s) ==
    LET t == host[s] IN
    /\ status[t] = "alive"
    /\ status' = [status EXCEPT ![t] = "lost"]
    /\ hosted' = [hosted EXCEPT ![t] = {s}]
    /\ pending' = {}
    /\ LET others == {x \in Tms : status[x] = "alive" /\ x # t}
           g == UNION {Garbage(x, uses[x], {}) : x \in others}
       IN /\ pins' = [x \in Tms |-> IF x \in others THEN [c \in Cks |-> {}] ELSE pins[x]]
          /\ exists' = exists \ g
          /\ deleted' = deleted \cup g
    /\ clean' = FALSE
    /\ UNCHANGED <<host, uses, owner, creator, origin, shared, acks, refs, retained,
                   nextCk, nextFile, nextTm, deferred, badDeletes>>

(***************************************************************************)
(* R60, R62, R105: failover replaces each lost attempt by a new one and    *)
(* every database reopens, in place, on the files the latest retained      *)
(* checkpoint refers to for its subtask; a survivor deletes its private    *)
(* files the checkpoint lacks (R62); a lost attempt's wait for it (R64).   *)
(***************************************************************************)
Latest == IF retained = {} THEN {} ELSE refs[Max(retained)]

Failover ==
    LET lost == {s \in Subs : status[host[s]] # "alive"}
        newTm == [s \in Subs |-> IF s \in lost
                                 THEN nextTm + Cardinality({x \in lost : x < s})
                                 ELSE host[s]]
        opened == [s \in Subs |-> {f \in Latest : origin[f] = s}]
        u2 == [t \in Tms |-> IF \E s \in Subs : newTm[s] = t
                             THEN opened[CHOOSE s \in Subs : newTm[s] = t]
                             ELSE IF status[t] = "alive" THEN {} ELSE uses[t]]
        survivors == {host[s] : s \in Subs \ lost}
        g == {f \in exists : owner[f] \in survivors /\ f \notin shared
                             /\ f \notin u2[owner[f]]}
    IN
    /\ nextTm + Cardinality(lost) <= MaxTm + 1
    /\ host' = newTm
    /\ status' = [t \in Tms |-> IF \E s \in lost : newTm[s] = t THEN "alive" ELSE status[t]]
    /\ uses' = u2
    /\ pending' = {}
    /\ pins' = [t \in Tms |-> IF status[t] = "lost" THEN pins[t] ELSE [c \in Cks |-> {}]]
    /\ nextTm' = nextTm + Cardinality(lost)
    /\ exists' = exists \ g \* R62: each survivor deletes the files it owns in g
    /\ deleted' = deleted \cup g
    /\ clean' = FALSE
    /\ UNCHANGED <<hosted, owner, creator, origin, shared, acks, refs, retained, nextCk,
                   nextFile, deferred, badDeletes>>

(***************************************************************************)
(* R64, R106: once a lost attempt stopped, the coordinator takes what it   *)
(* owned and deletes what nothing needs; the deletes that waited run.      *)
(***************************************************************************)
AttemptStopped(t) ==
    LET formerly == {f \in exists : owner[f] = t}
        o2 == [f \in Fids |-> IF f \in formerly THEN Coord ELSE owner[f]]
        needed == RetainedRefs \cup PendingRefs \cup LiveUses
        waited == {f \in deferred : creator[f] = t}
        gone == ((formerly \ needed) \cup (waited \ needed)) \cap exists
    IN
    /\ status[t] = "lost"
    /\ status' = [status EXCEPT ![t] = "stopped"]
    /\ hosted' = [hosted EXCEPT ![t] = {}]
    /\ uses' = [uses EXCEPT ![t] = {}]
    /\ pins' = [pins EXCEPT ![t] = [c \in Cks |-> {}]]
    /\ owner' = o2
    /\ badDeletes' = badDeletes \cup {<<f, Coord>> : f \in {g \in gone : o2[g] # Coord}}
    /\ exists' = exists \ gone
    /\ deleted' = deleted \cup gone
    /\ deferred' = deferred \ waited
    /\ clean' = FALSE
    /\ UNCHANGED <<host, creator, origin, shared, pending, acks, refs, retained, nextCk,
                   nextFile, nextTm>>

(***************************************************************************)
(* Every action, and the specification.                                    *)
(***************************************************************************)
Next ==
    \/ \E s \in Subs, t \in Tms : WriteWorking(t, s)
    \/ \E s \in Subs, t \in Tms, f \in Fids : DropWorking(t, s, f)
    \/ Trigger
    \/ \E s \in Subs, t \in Tms, c \in Cks : SnapshotWorking(t, s, c)
    \/ \E s \in Subs, c \in Cks : Acknowledge(s, c)
    \/ \E c \in Cks : Complete(c) \/ Abort(c)
    \/ CollectWorking
    \/ \E s \in Subs : CrashTm(s)
    \/ Failover
    \/ \E t \in Tms : AttemptStopped(t)

Spec == Init /\ [][Next]_vars

(***************************************************************************)
(* I1 for working files: every file a retained checkpoint refers to in     *)
(* place exists.                                                           *)
(***************************************************************************)
NoDanglingWorkingInv == RetainedRefs \subseteq exists

(***************************************************************************)
(* I2, I5: no file deleted twice or by anyone but its owner.               *)
(***************************************************************************)
NoForeignDeleteWorkingInv == badDeletes = {}

(***************************************************************************)
(* I7: a live database's files exist and are its own or the coordinator's; *)
(* a file a checkpoint refers to is the coordinator's.                     *)
(***************************************************************************)
WorkingKeptInv ==
    /\ \A t \in Tms : Live(t) => uses[t] \subseteq exists
    /\ \A t \in Tms : Live(t) => \A f \in uses[t] : owner[f] \in {t, Coord}
    /\ \A f \in (RetainedRefs \cup PendingRefs) \cap exists : owner[f] = Coord

(***************************************************************************)
(* I3: every existing file has exactly one owner, a party that exists.     *)
(***************************************************************************)
OneOwnerWorkingInv == \A f \in exists : owner[f] = Coord \/ status[owner[f]] # "none"

(***************************************************************************)
(* I6: after a collection in a quiet state, every working file is referred *)
(* to by a retained checkpoint or used by a live database.                 *)
(***************************************************************************)
NoWorkingLeakWhenQuietInv == clean => exists \subseteq RetainedRefs \cup LiveUses
===================================================================================
