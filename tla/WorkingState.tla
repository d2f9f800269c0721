------------------------------ MODULE WorkingState ------------------------------
(***************************************************************************)
(* Who owns a working file of disaggregated state, and who may delete it:  *)
(* R100-R106 and I7 of spec/SPEC.md (section 11), the TLA+ twin of the     *)
(* working-state part of refimpl/machine.py (write_working, drop_working,  *)
(* _db_release, snapshot_working, acknowledge, collect_working,            *)
(* _open_databases, restore, _claim, end_job).                             *)
(*                                                                         *)
(* What the abstraction drops (the rest of the store is                    *)
(* CheckpointOwnership.tla's):                                             *)
(*  - NumOps operators at one parallelism; each subtask runs on its own TM *)
(*    attempt, so a database is named by its attempt; attempt ids are     *)
(*    1..MaxTm;                                                            *)
(*  - a snapshot refers to every file in place: the small files R103       *)
(*    uploads as merged segments are CheckpointOwnership's segments;      *)
(*  - notifications are immediate: completing or aborting a checkpoint     *)
(*    drops every attempt's unacknowledged snapshot of it at once;         *)
(*  - restore: one job runs at a time; Restore ends it and starts the next *)
(*    from one of its retained checkpoints, CLAIM or NO_CLAIM, at a        *)
(*    parallelism in RescalePars (never from a savepoint; no max           *)
(*    parallelism check; no small files copied out of segments, since      *)
(*    every file is referred to in place); key groups are 0..MaxPar-1, a   *)
(*    file carries those of the subtask that wrote it, and a working       *)
(*    directory is the files one subtask of one job wrote, so "an old      *)
(*    directory goes only once no retained checkpoint refers to it" is I1  *)
(*    on its files; the ended job's retained checkpoints are the user's    *)
(*    (R91) and no restore reads them but the chosen one;                  *)
(*  - no cancel, no coordinator restart, no storage faults, no savepoints; *)
(*  - files are ids 1..MaxFile, written whole (R101).                      *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

(***************************************************************************)
(* NumSub: the first job's parallelism (subtasks 1..NumSub).  MaxTm:       *)
(* attempt ids 1..MaxTm (the first NumSub start alive).  MaxFile: working  *)
(* file ids 1..MaxFile.  MaxCheckpoint: checkpoint ids 1..MaxCheckpoint.   *)
(* NumRetained: execution.checkpointing.num-retained.  Coord, User: the    *)
(* coordinator and the user, model values.  MaxJob: job ids 1..MaxJob      *)
(* (MaxJob - 1 restores).  RescalePars: the parallelisms a restore may     *)
(* choose.  MaxPar: the max parallelism, so the key groups are             *)
(* 0..MaxPar-1.  NumOps: the operators (vertices) with working state, all  *)
(* at the job's parallelism par: subtask s of the running job (1..par *    *)
(* NumOps) is index Idx(par, s) of operator Op(par, s).                    *)
(***************************************************************************)
CONSTANTS NumSub, MaxTm, MaxFile, MaxCheckpoint, NumRetained, Coord, User
CONSTANTS MaxJob, RescalePars, MaxPar, NumOps

ASSUME NumSub \in 1..MaxPar /\ RescalePars \subseteq 1..MaxPar /\ NumOps \in 1..2

(***************************************************************************)
(* Helpers.                                                                *)
(***************************************************************************)
Max(S) == CHOOSE x \in S : \A y \in S : y <= x
Min(S) == CHOOSE x \in S : \A y \in S : x <= y

Subs == 1..(Max(RescalePars \cup {NumSub}) * NumOps)
Ops == 1..NumOps
Tms == 1..MaxTm
Fids == 1..MaxFile
Cks == 1..MaxCheckpoint
Jobs == 1..MaxJob
KGs == 0..(MaxPar - 1)
Modes == {"CLAIM", "NO_CLAIM"}

VARIABLES
    status,     \* [Tms -> {"none", "alive", "lost", "stopped"}]
    host,       \* [Subs -> Tms \cup {0}]: the subtask's current attempt, 0 beyond par
    hosted,     \* [Tms -> SUBSET Subs]: what a lost attempt hosted (R64, R106)
    uses,       \* [Tms -> SUBSET Fids]: the files each attempt's database uses
    exists,     \* the working files on storage
    owner,      \* [Fids -> Tms \cup {Coord, User}]
    creator,    \* [Fids -> Tms]
    origin,     \* [Fids -> Subs]: the subtask whose database wrote it
    kgs,        \* [Fids -> SUBSET KGs]: that subtask's key groups
    fop,        \* [Fids -> Ops]: that subtask's operator (R105)
    fjob,       \* [Fids -> Jobs]: the job that wrote it (its working directory: fjob, origin)
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
    clean,      \* ghost: the last step was a collection in a quiet state (I6)
    job,        \* the running job
    par,        \* its parallelism: subtasks 1..par
    mode,       \* how it was restored: "none" (the first job), "CLAIM", "NO_CLAIM"
    userFiles   \* ghost: the files a job end or a NO_CLAIM restore gave the user

jobVars == <<job, par, mode, userFiles>>

vars == <<status, host, hosted, uses, exists, owner, creator, origin, kgs, fop, fjob, shared,
          pins, pending, acks, refs, retained, nextCk, nextFile, nextTm, deferred, deleted,
          badDeletes, clean, job, par, mode, userFiles>>

Active == 1..(par * NumOps)

(***************************************************************************)
(* Subtask s of a job at parallelism p: operator Op(p, s), index Idx(p, s) *)
(* (both counted from 1).                                                  *)
(***************************************************************************)
Op(p, s) == ((s - 1) \div p) + 1
Idx(p, s) == ((s - 1) % p) + 1

(***************************************************************************)
(* R75: key group g belongs to subtask s of parallelism p when             *)
(* g * p \div MaxPar = s - 1 (subtasks counted from 1 here).               *)
(***************************************************************************)
KeyGroups(p, s) == {g \in KGs : (g * p) \div MaxPar = s - 1}

(***************************************************************************)
(* R100: a database is live while its attempt is alive and hosts its       *)
(* subtask; a lost attempt's database is a zombie.  A file is private      *)
(* (owner its attempt, not shared, pinned by no snapshot), pinned, or      *)
(* shared (the coordinator's for good).                                    *)
(***************************************************************************)
Live(t) == status[t] = "alive" /\ \E s \in Active : host[s] = t

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
(* A delete: recorded in the ghosts; breaks I2 (gone already) or I5 (the   *)
(* actor is not the owner) in badDeletes.                                  *)
(***************************************************************************)
BadOf(F, actor) == {<<f, actor>> : f \in {g \in F : g \notin exists \/ owner[g] # actor}}

Delete(F, actor) ==
    /\ badDeletes' = badDeletes \cup BadOf(F, actor)
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
(* attempts alive, one per subtask, no file, no checkpoint, job 1.         *)
(***************************************************************************)
TypeOK ==
    /\ status \in [Tms -> {"none", "alive", "lost", "stopped"}]
    /\ host \in [Subs -> Tms \cup {0}]
    /\ \A s \in Subs : (host[s] = 0) <=> (s \notin Active)
    /\ uses \in [Tms -> SUBSET Fids]
    /\ exists \subseteq Fids /\ shared \subseteq Fids
    /\ owner \in [Fids -> Tms \cup {Coord, User}]
    /\ kgs \in [Fids -> SUBSET KGs] /\ fop \in [Fids -> Ops] /\ fjob \in [Fids -> Jobs]
    /\ pins \in [Tms -> [Cks -> SUBSET Fids]]
    /\ pending \subseteq Cks /\ retained \subseteq Cks
    /\ job \in Jobs /\ par \in RescalePars \cup {NumSub}
    /\ mode \in Modes \cup {"none"} /\ userFiles \subseteq Fids

Init ==
    /\ status = [t \in Tms |-> IF t <= NumSub * NumOps THEN "alive" ELSE "none"]
    /\ host = [s \in Subs |-> IF s <= NumSub * NumOps THEN s ELSE 0]
    /\ hosted = [t \in Tms |-> {}]
    /\ uses = [t \in Tms |-> {}]
    /\ exists = {} /\ shared = {}
    /\ owner = [f \in Fids |-> Coord]
    /\ creator = [f \in Fids |-> 1]
    /\ origin = [f \in Fids |-> 1]
    /\ kgs = [f \in Fids |-> {}]
    /\ fop = [f \in Fids |-> 1]
    /\ fjob = [f \in Fids |-> 1]
    /\ pins = [t \in Tms |-> [c \in Cks |-> {}]]
    /\ pending = {} /\ retained = {}
    /\ acks = [c \in Cks |-> {}]
    /\ refs = [c \in Cks |-> {}]
    /\ nextCk = 1 /\ nextFile = 1 /\ nextTm = NumSub * NumOps + 1
    /\ deferred = {} /\ deleted = {} /\ badDeletes = {}
    /\ clean = FALSE
    /\ job = 1 /\ par = NumSub /\ mode = "none" /\ userFiles = {}

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
       /\ kgs' = [kgs EXCEPT ![f] = KeyGroups(par, Idx(par, s))]
       /\ fop' = [fop EXCEPT ![f] = Op(par, s)]
       /\ fjob' = [fjob EXCEPT ![f] = job]
       /\ uses' = [uses EXCEPT ![t] = @ \cup {f}]
    /\ nextFile' = nextFile + 1
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, shared, pins, pending, acks, refs, retained,
                   nextCk, nextTm, deferred, deleted, badDeletes>>
    /\ UNCHANGED jobVars

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
    /\ UNCHANGED <<status, host, hosted, owner, creator, origin, kgs, fop, fjob, shared, pins,
                   pending, acks, refs, retained, nextCk, nextFile, nextTm, deferred>>
    /\ UNCHANGED jobVars

DropWorking(t, s, f) == DropWith(t, s, f, DropDelete(t, f))

(***************************************************************************)
(* R50: the coordinator starts the next checkpoint.                        *)
(***************************************************************************)
Trigger ==
    /\ nextCk <= MaxCheckpoint
    /\ pending' = pending \cup {nextCk}
    /\ nextCk' = nextCk + 1
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, exists, owner, creator, origin, kgs, fop, fjob,
                   shared, pins, acks, refs, retained, nextFile, nextTm, deferred, deleted,
                   badDeletes>>
    /\ UNCHANGED jobVars

(***************************************************************************)
(* R103: a snapshot refers to every file the database uses, in place: a    *)
(* pin of its attempt until the acknowledgement.  A zombie may snapshot    *)
(* too (its acknowledgement is ignored, R56).  R105, NO_CLAIM: a file of   *)
(* the user's it still uses is first copied into a new private file, which *)
(* it uses instead, so the new job's checkpoints refer only to its own.    *)
(***************************************************************************)
SnapshotWorking(t, s, c) ==
    LET theirs == {f \in uses[t] : owner[f] = User}
        copies == {f \in Fids : nextFile <= f /\ f < nextFile + Cardinality(theirs)}
        u2 == (uses[t] \ theirs) \cup copies
    IN
    /\ Acting(t, s)
    /\ c \in pending
    /\ s \notin acks[c]
    /\ nextFile + Cardinality(theirs) <= MaxFile + 1
    /\ exists' = exists \cup copies
    /\ owner' = [f \in Fids |-> IF f \in copies THEN t ELSE owner[f]]
    /\ creator' = [f \in Fids |-> IF f \in copies THEN t ELSE creator[f]]
    /\ origin' = [f \in Fids |-> IF f \in copies THEN s ELSE origin[f]]
    /\ kgs' = [f \in Fids |-> IF f \in copies THEN KeyGroups(par, Idx(par, s)) ELSE kgs[f]]
    /\ fop' = [f \in Fids |-> IF f \in copies THEN Op(par, s) ELSE fop[f]]
    /\ fjob' = [f \in Fids |-> IF f \in copies THEN job ELSE fjob[f]]
    /\ uses' = [uses EXCEPT ![t] = u2]
    /\ pins' = [pins EXCEPT ![t][c] = @ \cup u2]
    /\ nextFile' = nextFile + Cardinality(theirs)
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, shared, pending, acks, refs, retained, nextCk,
                   nextTm, deferred, deleted, badDeletes>>
    /\ UNCHANGED jobVars

(***************************************************************************)
(* R103: the live attempt's acknowledgement hands what it refers to in     *)
(* place to the coordinator, for good; its pins go (R102).                 *)
(***************************************************************************)
Acknowledge(s, c) ==
    LET t == host[s]
        F == pins[t][c] \cap exists
        p2 == [pins EXCEPT ![t][c] = {}]
    IN
    /\ s \in Active
    /\ status[t] = "alive"
    /\ c \in pending
    /\ s \notin acks[c]
    /\ shared' = shared \cup F
    /\ owner' = [f \in Fids |-> IF f \in F THEN Coord ELSE owner[f]]
    /\ refs' = [refs EXCEPT ![c] = @ \cup F]
    /\ acks' = [acks EXCEPT ![c] = @ \cup {s}]
    /\ pins' = p2
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, exists, creator, origin, kgs, fop, fjob, pending,
                   retained, nextCk, nextFile, nextTm, deferred, deleted, badDeletes>>
    /\ UNCHANGED jobVars

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
    /\ acks[c] = Active
    /\ LET kept == retained \cup {c}
           r2 == IF Cardinality(kept) > NumRetained THEN kept \ {Min(kept)} ELSE kept
           done == {x \in pending : x <= c}
       IN /\ retained' = r2
          /\ pending' = pending \ done
          /\ pins' = DropPins(done)
          /\ exists' = exists \ FinishGarbage(done)
          /\ deleted' = deleted \cup FinishGarbage(done)
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, owner, creator, origin, kgs, fop, fjob, shared,
                   acks, refs, nextCk, nextFile, nextTm, deferred, badDeletes>>
    /\ UNCHANGED jobVars

Abort(c) ==
    /\ c \in pending
    /\ pending' = pending \ {c}
    /\ pins' = DropPins({c})
    /\ exists' = exists \ FinishGarbage({c})
    /\ deleted' = deleted \cup FinishGarbage({c})
    /\ clean' = FALSE
    /\ UNCHANGED <<status, host, hosted, uses, owner, creator, origin, kgs, fop, fjob, shared,
                   acks, refs, retained, nextCk, nextFile, nextTm, deferred, badDeletes>>
    /\ UNCHANGED jobVars

(***************************************************************************)
(* R104: the coordinator's collection.  A file a lost attempt wrote waits  *)
(* for it to stop (R64).  I6's ghost: a collection in a quiet state.       *)
(* CollectWith(C) deletes C the same way (a must-fail model widens it).    *)
(***************************************************************************)
Collectable ==
    {f \in exists : f \in shared /\ owner[f] = Coord /\ f \notin RetainedRefs
                    /\ f \notin PendingRefs /\ f \notin LiveUses}

Quiet == pending = {} /\ \A t \in Tms : status[t] # "lost"

CollectWith(C) ==
    LET waits == {f \in C : status[creator[f]] = "lost"}
        now == C \ waits
    IN /\ Delete(now, Coord)
       /\ deferred' = deferred \cup waits
       /\ clean' = Quiet
       /\ UNCHANGED <<status, host, hosted, uses, owner, creator, origin, kgs, fop, fjob, shared,
                      pins, pending, acks, refs, retained, nextCk, nextFile, nextTm>>
       /\ UNCHANGED jobVars

CollectWorking == CollectWith(Collectable)

(***************************************************************************)
(* R57: a lost attempt aborts every pending checkpoint; it may go on as a  *)
(* zombie (R106).                                                          *)
(***************************************************************************)
CrashTm(s) ==
    LET t == host[s] IN
    /\ s \in Active
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
    /\ UNCHANGED <<host, uses, owner, creator, origin, kgs, fop, fjob, shared, acks, refs,
                   retained, nextCk, nextFile, nextTm, deferred, badDeletes>>
    /\ UNCHANGED jobVars

(***************************************************************************)
(* R60, R62, R105: failover replaces each lost attempt by a new one and    *)
(* every database reopens, in place, on the files the latest retained      *)
(* checkpoint refers to for its operator and its subtask's key groups      *)
(* (Opened: never another operator's, whatever its key groups); a survivor *)
(* deletes its private files the checkpoint lacks (R62); a lost attempt's  *)
(* wait for it (R64).                                                      *)
(***************************************************************************)
Latest == IF retained = {} THEN {} ELSE refs[Max(retained)]

OpenedByKeyGroups(F, p, s) == {f \in F : kgs[f] \cap KeyGroups(p, Idx(p, s)) # {}}

Opened(F, p, s) == {f \in OpenedByKeyGroups(F, p, s) : fop[f] = Op(p, s)}

(***************************************************************************)
(* FailoverWith(Open) and RestoreWith(..., Open) open the databases with   *)
(* Open: Opened here, a wrong opening in a must-fail model.                *)
(***************************************************************************)
FailoverWith(Open(_, _, _)) ==
    LET lost == {s \in Active : status[host[s]] # "alive"}
        newTm == [s \in Subs |-> IF s \in lost
                                 THEN nextTm + Cardinality({x \in lost : x < s})
                                 ELSE host[s]]
        opened == [s \in Subs |-> Open(Latest, par, s)]
        u2 == [t \in Tms |-> IF \E s \in Active : newTm[s] = t
                             THEN opened[CHOOSE s \in Active : newTm[s] = t]
                             ELSE IF status[t] = "alive" THEN {} ELSE uses[t]]
        survivors == {host[s] : s \in Active \ lost}
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
    /\ UNCHANGED <<hosted, owner, creator, origin, kgs, fop, fjob, shared, acks, refs, retained,
                   nextCk, nextFile, deferred, badDeletes>>
    /\ UNCHANGED jobVars

Failover == FailoverWith(Opened)

(***************************************************************************)
(* R64, R106: once a lost attempt stopped, the coordinator takes what it   *)
(* owned and deletes what nothing needs; the deletes that waited run,      *)
(* except on what became the user's meanwhile.                             *)
(***************************************************************************)
AttemptStopped(t) ==
    LET formerly == {f \in exists : owner[f] = t}
        o2 == [f \in Fids |-> IF f \in formerly THEN Coord ELSE owner[f]]
        needed == RetainedRefs \cup PendingRefs \cup LiveUses
        waited == {f \in deferred : creator[f] = t}
        gone == ((formerly \ needed) \cup {f \in waited \ needed : owner[f] # User})
                \cap exists
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
    /\ UNCHANGED <<host, creator, origin, kgs, fop, fjob, shared, pending, acks, refs, retained,
                   nextCk, nextFile, nextTm>>
    /\ UNCHANGED jobVars

(***************************************************************************)
(* R70, R90, R91: a restore from a retained checkpoint c ends the running  *)
(* job and starts job + 1 at parallelism p on p new attempts.  The ending  *)
(* job's pending checkpoints abort; its databases close and each live      *)
(* attempt deletes its private files (R102: nothing uses or pins them any  *)
(* more); its retained checkpoints and the files they refer to become the  *)
(* user's; the coordinator deletes what it owns and nothing refers to, a   *)
(* lost attempt's files waiting for it (R64).  A zombie stays in its job   *)
(* (R106).  R72 CLAIM: the coordinator takes c's files back and retains c  *)
(* until subsumed, so the old working directories go file by file under    *)
(* R104.  R73 NO_CLAIM: c's files stay the user's, nothing is retained.    *)
(* R75, R105: each new subtask's database opens, in place and with no      *)
(* copy, the files of c of its own operator whose key groups overlap its   *)
(* own (a projection; a file may be opened by several databases).          *)
(***************************************************************************)
RestoreWith(c, p, m, Open(_, _, _)) ==
    LET IsNew(t) == nextTm <= t /\ t < nextTm + p * NumOps
        cur == {t \in Tms : status[t] = "alive"}
        closed == {f \in exists : owner[f] \in cur /\ f \notin shared} \* each by its owner
        given == RetainedRefs
        claimed == IF m = "CLAIM" THEN refs[c] ELSE {}
        unref == {f \in exists \ closed : owner[f] = Coord /\ f \notin given}
        waits == {f \in unref : status[creator[f]] = "lost"}
        now == unref \ waits
    IN
    /\ c \in retained
    /\ job < MaxJob
    /\ nextTm + p * NumOps <= MaxTm + 1
    /\ job' = job + 1 /\ par' = p /\ mode' = m
    /\ status' = [t \in Tms |-> IF t \in cur THEN "stopped"
                               ELSE IF IsNew(t) THEN "alive" ELSE status[t]]
    /\ hosted' = [t \in Tms |-> IF status[t] = "lost" THEN {} ELSE hosted[t]]
    /\ host' = [s \in Subs |-> IF s <= p * NumOps THEN nextTm + s - 1 ELSE 0]
    /\ uses' = [t \in Tms |-> IF t \in cur THEN {}
                             ELSE IF IsNew(t) THEN Open(refs[c], p, t - nextTm + 1)
                             ELSE uses[t]]
    /\ pins' = [t \in Tms |-> IF t \in cur THEN [x \in Cks |-> {}] ELSE pins[t]]
    /\ owner' = [f \in Fids |-> IF f \in claimed THEN Coord
                                ELSE IF f \in given THEN User ELSE owner[f]]
    /\ badDeletes' = badDeletes \cup BadOf(now, Coord)
    /\ exists' = exists \ (closed \cup now)
    /\ deleted' = deleted \cup closed \cup now
    /\ deferred' = deferred \cup waits
    /\ pending' = {}
    /\ retained' = IF m = "CLAIM" THEN {c} ELSE {}
    /\ nextTm' = nextTm + p * NumOps
    /\ userFiles' = userFiles \cup (given \ claimed)
    /\ clean' = FALSE
    /\ UNCHANGED <<creator, origin, kgs, fop, fjob, shared, acks, refs, nextCk, nextFile>>

Restore(c, p, m) == RestoreWith(c, p, m, Opened)

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
    \/ \E c \in Cks, p \in RescalePars, m \in Modes : Restore(c, p, m)

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
(* I7: a live database's files exist and are its own, the coordinator's    *)
(* or the user's; a file a checkpoint of the running job refers to is the  *)
(* coordinator's (the user's only once R91 ends the job, which this        *)
(* stricter form leaves out: CLAIM takes c's files back, NO_CLAIM refers   *)
(* to copies).                                                             *)
(***************************************************************************)
WorkingKeptInv ==
    /\ \A t \in Tms : Live(t) => uses[t] \subseteq exists
    /\ \A t \in Tms : Live(t) => \A f \in uses[t] : owner[f] \in {t, Coord, User}
    /\ \A f \in (RetainedRefs \cup PendingRefs) \cap exists : owner[f] = Coord

(***************************************************************************)
(* I3: every existing file has exactly one owner, a party that exists.     *)
(***************************************************************************)
OneOwnerWorkingInv == \A f \in exists : owner[f] \in {Coord, User} \/ status[owner[f]] # "none"

(***************************************************************************)
(* I6: after a collection in a quiet state, every working file is referred *)
(* to by a retained checkpoint, used by a live database, or the user's.    *)
(***************************************************************************)
NoWorkingLeakWhenQuietInv ==
    clean => exists \subseteq RetainedRefs \cup LiveUses \cup {f \in Fids : owner[f] = User}

(***************************************************************************)
(* I5 for the user's files (R73, R91, R105): every file a job's end or a   *)
(* NO_CLAIM restore gave the user still exists and is still the user's: no *)
(* database and no collection of a later job deleted or took it.           *)
(***************************************************************************)
UserFilesKeptInv == \A f \in userFiles : f \in exists /\ owner[f] = User

(***************************************************************************)
(* I7, R105: a live database uses only files its own operator's databases  *)
(* wrote (a window's database never opens a join's files).                 *)
(***************************************************************************)
OwnOperatorInv ==
    \A s \in Active : Live(host[s]) => \A f \in uses[host[s]] : fop[f] = Op(par, s)

(***************************************************************************)
(* R105 NO_CLAIM: every checkpoint of a job restored NO_CLAIM, from its    *)
(* first acknowledgement on, refers in place only to files that job wrote. *)
(***************************************************************************)
NoClaimOwnFilesInv ==
    mode = "NO_CLAIM" => \A c \in pending \cup retained : \A f \in refs[c] : fjob[f] = job
===================================================================================
