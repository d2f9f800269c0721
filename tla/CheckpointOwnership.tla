------------------------------ MODULE CheckpointOwnership ------------------------------
(***************************************************************************)
(* Who owns a checkpoint file, and who may delete it, when.                *)
(*                                                                         *)
(* The TLA+ twin of the reference model refimpl/machine.py: the rules      *)
(* R1-R95 and invariants I1-I6 of spec/SPEC.md, at the abstraction level   *)
(* a model checker can afford.  Theory of operation, as in refimpl:        *)
(*                                                                         *)
(*  - The whole state is a record st of all variables.  Every command of   *)
(*    spec/commands.py is a pure operator Do<Command>(s, args) from a      *)
(*    state record to a state record, built from the same helpers as       *)
(*    refimpl (CheckFile = _check_file, Discard = _discard, ...), and an   *)
(*    action <Command>(args) == guard /\ Goto(Do<Command>(st, args)).      *)
(*    Sequential loops of refimpl are folds (FoldSet, FoldInOrder) where   *)
(*    the order matters, bulk set operations where it does not.            *)
(*  - Storage is part of the state (files, dirs); every delete goes        *)
(*    through DeleteFiles / DeleteDir, which defer a delete that must      *)
(*    wait for a lost attempt (R64) and record in badDeletes every delete  *)
(*    that breaks I2 or I5, so those invariants can judge it.              *)
(*                                                                         *)
(* What the abstraction drops (each place says so again):                  *)
(*  - one vertex "v" with one piece of KEYED_SHARED state per subtask      *)
(*    ("sst", SegSize bytes), written or reused at most once per           *)
(*    checkpoint; no EXCLUSIVE scope, so no taskowned/ directories (R13,   *)
(*    R63 are not modelled), no chk-N exclusive files and no inline state  *)
(*    (R107);                                                              *)
(*  - no savepoints (R35, R55), no storage faults (FailNextCall,           *)
(*    RetryDeletes, R17, R45, R51), no coordinator restart (R95);          *)
(*  - rescaling (R75, R76) only decides which new subtask reads which      *)
(*    handle; restored files are never owned, reused or deleted by TMs     *)
(*    (R71), so the model keeps the restored handles as one set;           *)
(*  - paths are abstract ids: data file <<"data", n>>, metadata            *)
(*    <<"meta", c>>, a subtask's shared directory <<job, par, index>>.     *)
(***************************************************************************)
EXTENDS Naturals, FiniteSets

(***************************************************************************)
(* Mode: the merging mode, "NONE", "WITHIN" or "ACROSS" (Config.merging_   *)
(* mode; R11-R14).                                                         *)
(***************************************************************************)
CONSTANT Mode

(***************************************************************************)
(* NumTms: how many TMs every job starts with (JobSpec.num_tms).           *)
(***************************************************************************)
CONSTANT NumTms

(***************************************************************************)
(* Par0: the parallelism of the single vertex in the first job.            *)
(***************************************************************************)
CONSTANT Par0

(***************************************************************************)
(* MaxTm: TM ids are 1..MaxTm.  A TM id is an attempt (SPEC §0): a         *)
(* replacement after failover (R60) and every TM of a restored job (R70)   *)
(* takes a fresh id; an action that needs more ids than are left is not    *)
(* enabled.  This is what bounds crashes and failovers.                    *)
(***************************************************************************)
CONSTANT MaxTm

(***************************************************************************)
(* MaxCheckpoint: Trigger is enabled while the next id is <= this bound    *)
(* (R50: ids strictly increase, also across failover and restore).         *)
(***************************************************************************)
CONSTANT MaxCheckpoint

(***************************************************************************)
(* NumRetained: execution.checkpointing.num-retained (R52).                *)
(***************************************************************************)
CONSTANT NumRetained

(***************************************************************************)
(* SegSize: the bytes of one write of the "sst" state (every stream has    *)
(* this size).  PartialSize: the bytes a crash in the middle of a write    *)
(* leaves behind (R65).                                                    *)
(***************************************************************************)
CONSTANTS SegSize, PartialSize

(***************************************************************************)
(* MaxFileSize: execution.checkpointing.file-merging.max-file-size, in    *)
(* bytes (R12: roll before a segment would exceed it, close once reached).*)
(***************************************************************************)
CONSTANT MaxFileSize

(***************************************************************************)
(* AmpBound: max-space-amplification as a natural number; 0 disables the   *)
(* bound (R82: any value below 1 disables it).  R80, R81.                  *)
(***************************************************************************)
CONSTANT AmpBound

(***************************************************************************)
(* MaxChannel: DuplicateNotification is enabled only while fewer than      *)
(* this many notifications are in flight (the bound of model_tests/        *)
(* explore.py).                                                            *)
(***************************************************************************)
CONSTANT MaxChannel

(***************************************************************************)
(* MaxJob: jobs are numbered 1..MaxJob; Restore (R70) starts job + 1 and   *)
(* is enabled while job < MaxJob.  1 disables Restore.                     *)
(***************************************************************************)
CONSTANT MaxJob

(***************************************************************************)
(* RescalePars: the parallelisms a Restore may choose (R75, R76).          *)
(***************************************************************************)
CONSTANT RescalePars

(***************************************************************************)
(* Coord and User: model values for the coordinator and the user as        *)
(* owners and actors (spec/effects.py COORDINATOR, USER).  A TM owner or   *)
(* actor is its id, a natural number; 0 means "nobody" / "no TM".          *)
(***************************************************************************)
CONSTANTS Coord, User

ASSUME
    /\ Mode \in {"NONE", "WITHIN", "ACROSS"}
    /\ NumTms \in Nat \ {0}
    /\ Par0 \in Nat \ {0}
    /\ MaxTm \in Nat /\ MaxTm >= NumTms
    /\ MaxCheckpoint \in Nat
    /\ NumRetained \in Nat \ {0}
    /\ SegSize \in Nat \ {0} /\ PartialSize \in 1..(SegSize - 1)
    /\ MaxFileSize \in Nat \ {0}
    /\ AmpBound \in Nat
    /\ MaxChannel \in Nat
    /\ MaxJob \in Nat \ {0}
    /\ RescalePars \subseteq Nat \ {0}
    /\ Coord # User

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* Coordinator.                                                            *)
(*   running: the current job runs (FALSE after Cancel, R90).              *)
(*   job: the current job's number (R70: a restore starts a new job).      *)
(*   par: the current parallelism of the vertex.                           *)
(*   placement: subtask index -> the TM id hosting it (round robin).       *)
(*   nextCkpt: the next checkpoint id (R50).                               *)
(*   pending: checkpoint id -> [acks: subtask -> entries,                  *)
(*            received: files the acks handed to the coordinator (R43)].   *)
(*   retained: the retained completed checkpoints, records [id, job,       *)
(*            entries, dirs, meta] (R52); a set, ordered by id.            *)
(*   latestCompleted, watermark: R30 (the watermark is the highest         *)
(*            subsumed id).                                                *)
(*   registry: logical id -> [file, entry, refs, owned, pins] (R22, R54).  *)
(*   dirReg: directory -> refs, the "dir:" keys of refimpl's registry.     *)
(*   restoring: the handles the running job restored from, until its       *)
(*            first checkpoint completes (I1).                             *)
(***************************************************************************)
VARIABLES running, job, par, placement, nextCkpt, pending, retained,
          latestCompleted, watermark, registry, dirReg, restoring

(***************************************************************************)
(* TMs (each TM's memory; refimpl keys these by TM id).                    *)
(*   tms: id -> [status ("alive", "lost", "stopped"), finishedMark,        *)
(*         knownAborted, firstCkpt, hosted] (TmRec; known_completed and    *)
(*         known_watermark are written but never read by refimpl and are   *)
(*         dropped).                                                       *)
(*   segs: id -> logical id -> [file, off, sub, createdFor, lastUsed,      *)
(*         confirmed]: the segment table (R10, R21, R33).                  *)
(*   pfiles: id -> file -> [open, ref, live, size, reusable, sub, ckpt,    *)
(*         dir]: the physical files its merging manager tracks, with ref   *)
(*         counts (R15); an open one is the pooled file of (sub, ckpt),    *)
(*         ckpt = 0 for ACROSS pools and restored files.                   *)
(*   outputs: set of [tm, sub, cp, e]: written, not yet acknowledged.      *)
(*   acked: set of [tm, sub, cp, e]: acknowledged (e the sst entry or      *)
(*         NoEntry), kept until confirmed (R23).                           *)
(*   backend: id -> subtask -> [e, ckpt, confirmed]: what the subtask's    *)
(*         backend remembers uploading (R20, R23).                         *)
(***************************************************************************)
VARIABLES tms, segs, pfiles, outputs, acked, backend

(***************************************************************************)
(* Storage.                                                                *)
(*   files: file id -> [dir, owner, creator, open, size]: files that       *)
(*          exist (creator 0: written by no TM, e.g. _metadata).           *)
(*   dirs: directory -> [owner, creator, usedBy, handedOver]: managed      *)
(*          directories that exist; usedBy is the SET of checkpoint ids    *)
(*          whose acknowledgement reported it (R41, never a counter).      *)
(*   deleted: every file id ever deleted (R2: never created again).        *)
(*   badDeletes: ghost: every delete that broke I2 or I5, with the actor,  *)
(*          the owner at that moment, whether the file existed and         *)
(*          whether it was protected (the user's).                         *)
(*   deferred: deletes that wait for a lost attempt to stop (R64), as      *)
(*          [actor, file, dir, isDir, waitsFor].                           *)
(***************************************************************************)
VARIABLES files, dirs, deleted, badDeletes, deferred

(***************************************************************************)
(* The notification channel: a bag (notice -> copies in flight) of         *)
(* [tm, kind ("complete" | "abort"), ckpt, mark].  A bag has no order:     *)
(* any copy may be delivered next (reordering), dropped (loss) or copied   *)
(* (duplication), R34.                                                     *)
(***************************************************************************)
VARIABLE channel

(***************************************************************************)
(* Id sources (R2): the next data file number, logical id and TM id.       *)
(***************************************************************************)
VARIABLES nextFile, nextLid, nextTm

(***************************************************************************)
(* calm: ghost for "quiet" (SPEC §11): how many checkpoints completed in a *)
(* row, each while nothing was lost, nothing deferred, no notification in  *)
(* flight and no other checkpoint pending, since the last fault (a crash,  *)
(* a lost notification, an abort, a decline, a failover, a restore);       *)
(* capped at NumRetained + 1.                                              *)
(***************************************************************************)
VARIABLE calm

vars == <<running, job, par, placement, nextCkpt, pending, retained, latestCompleted,
          watermark, registry, dirReg, restoring, tms, segs, pfiles, outputs, acked,
          backend, files, dirs, deleted, badDeletes, deferred, channel, nextFile,
          nextLid, nextTm, calm>>

(***************************************************************************)
(* The state as one record, and the two ways to set every variable from    *)
(* such a record: Is (initial state) and Goto (next state).                *)
(***************************************************************************)
st == [running |-> running, job |-> job, par |-> par, placement |-> placement,
       nextCkpt |-> nextCkpt, pending |-> pending, retained |-> retained,
       latestCompleted |-> latestCompleted, watermark |-> watermark,
       registry |-> registry, dirReg |-> dirReg, restoring |-> restoring,
       tms |-> tms, segs |-> segs, pfiles |-> pfiles, outputs |-> outputs,
       acked |-> acked, backend |-> backend, files |-> files, dirs |-> dirs,
       deleted |-> deleted, badDeletes |-> badDeletes, deferred |-> deferred,
       channel |-> channel, nextFile |-> nextFile, nextLid |-> nextLid,
       nextTm |-> nextTm, calm |-> calm]

Is(s) ==
    /\ running = s.running
    /\ job = s.job
    /\ par = s.par
    /\ placement = s.placement
    /\ nextCkpt = s.nextCkpt
    /\ pending = s.pending
    /\ retained = s.retained
    /\ latestCompleted = s.latestCompleted
    /\ watermark = s.watermark
    /\ registry = s.registry
    /\ dirReg = s.dirReg
    /\ restoring = s.restoring
    /\ tms = s.tms
    /\ segs = s.segs
    /\ pfiles = s.pfiles
    /\ outputs = s.outputs
    /\ acked = s.acked
    /\ backend = s.backend
    /\ files = s.files
    /\ dirs = s.dirs
    /\ deleted = s.deleted
    /\ badDeletes = s.badDeletes
    /\ deferred = s.deferred
    /\ channel = s.channel
    /\ nextFile = s.nextFile
    /\ nextLid = s.nextLid
    /\ nextTm = s.nextTm
    /\ calm = s.calm

Goto(s) ==
    /\ running' = s.running
    /\ job' = s.job
    /\ par' = s.par
    /\ placement' = s.placement
    /\ nextCkpt' = s.nextCkpt
    /\ pending' = s.pending
    /\ retained' = s.retained
    /\ latestCompleted' = s.latestCompleted
    /\ watermark' = s.watermark
    /\ registry' = s.registry
    /\ dirReg' = s.dirReg
    /\ restoring' = s.restoring
    /\ tms' = s.tms
    /\ segs' = s.segs
    /\ pfiles' = s.pfiles
    /\ outputs' = s.outputs
    /\ acked' = s.acked
    /\ backend' = s.backend
    /\ files' = s.files
    /\ dirs' = s.dirs
    /\ deleted' = s.deleted
    /\ badDeletes' = s.badDeletes
    /\ deferred' = s.deferred
    /\ channel' = s.channel
    /\ nextFile' = s.nextFile
    /\ nextLid' = s.nextLid
    /\ nextTm' = s.nextTm
    /\ calm' = s.calm

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* Generic helpers: finite maps, folds, bags.                              *)
(***************************************************************************)
MinOf(S) == CHOOSE m \in S : \A n \in S : m <= n
MaxOf(S) == CHOOSE m \in S : \A n \in S : n <= m
EmptyFn == [x \in {} |-> 0]
Put(f, k, v) == [x \in DOMAIN f \cup {k} |-> IF x = k THEN v ELSE f[x]]
Without(f, K) == [x \in DOMAIN f \ K |-> f[x]]

(* Apply Op to every element of S, in some order: used where the order     *)
(* does not change the result (each step touches its own element).         *)
RECURSIVE FoldSet(_, _, _)
FoldSet(Op(_, _), acc, S) ==
    IF S = {} THEN acc
    ELSE LET x == CHOOSE y \in S : TRUE
         IN  FoldSet(Op, Op(acc, x), S \ {x})

(* Apply Op to every number in S, smallest first (refimpl's sorted loops). *)
RECURSIVE FoldInOrder(_, _, _)
FoldInOrder(Op(_, _), acc, S) ==
    IF S = {} THEN acc
    ELSE LET x == MinOf(S)
         IN  FoldInOrder(Op, Op(acc, x), S \ {x})

BagAddAll(b, N) ==
    [n \in DOMAIN b \cup N |-> (IF n \in DOMAIN b THEN b[n] ELSE 0) + (IF n \in N THEN 1 ELSE 0)]
BagRemove(b, n) == IF b[n] = 1 THEN Without(b, {n}) ELSE [b EXCEPT ![n] = @ - 1]
BagSize(b) == FoldSet(LAMBDA acc, n : acc + b[n], 0, DOMAIN b)

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* Ids and records.                                                        *)
(***************************************************************************)
NoFile == <<"none", 0>>
NoDir == <<0, 0, 0>>
DataFile(n) == <<"data", n>>
MetaFile(c) == <<"meta", c>>
SharedDir(j, p, i) == <<j, p, i>>                 \* R1: <job>/shared/v-<i>-<p>/

(* A state entry: a handle with the subtask that reported it.  kind is     *)
(* "seg" (SegmentHandle), "file" (FileHandle, mode NONE), "ph"             *)
(* (PlaceholderHandle, R22), "dir" (DirectoryHandle, R40) or "none".       *)
(* dir is where the file lies (or the directory itself for "dir").         *)
Entry(kind, f, off, lid, d, i) ==
    [kind |-> kind, file |-> f, off |-> off, lid |-> lid, dir |-> d, sub |-> i]
NoEntry == Entry("none", NoFile, 0, 0, NoDir, 0)
NoRef == [e |-> NoEntry, ckpt |-> 0, confirmed |-> FALSE]

NewTm(first, mark) ==
    [status |-> "alive", finishedMark |-> mark, knownAborted |-> {},
     firstCkpt |-> first, hosted |-> {}]

Ckpts == 1..MaxCheckpoint
PlacedTms(s) == {s.placement[i] : i \in DOMAIN s.placement}
CurrentTms(s) == {t \in PlacedTms(s) : s.tms[t].status = "alive"}  \* refimpl current_tms
AliveTms(s) == IF s.running THEN CurrentTms(s) ELSE {}            \* observe()'s alive
HostedBy(s, t) == {i \in DOMAIN s.placement : s.placement[i] = t}
LostTms(s) == {t \in DOMAIN s.tms : s.tms[t].status = "lost"}

(* A file the retained checkpoints or the restoring handles refer to.      *)
Referenced(s, f) ==
    \/ \E r \in s.retained : f = r.meta \/ \E e \in r.entries : e.file = f
    \/ \E e \in s.restoring : e.file = f

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* Storage calls and deletes (refimpl _fs_*, _delete_file, _delete_dir).   *)
(***************************************************************************)
CloseStorage(s, f) ==
    IF f \in DOMAIN s.files /\ s.files[f].open
    THEN [s EXCEPT !.files[f].open = FALSE]
    ELSE s

(* R64: a lost attempt's files are deleted by others only once it stopped. *)
WaitsFor(s, creator, actor) ==
    IF /\ creator # 0
       /\ creator # actor
       /\ creator \in DOMAIN s.tms
       /\ s.tms[creator].status = "lost"
    THEN creator ELSE 0

(* Delete the files D now, recording every delete that breaks I2 or I5.    *)
RemoveFiles(s, D, actor) ==
    LET gone(f) == f \notin DOMAIN s.files
        owner(f) == IF gone(f) THEN 0 ELSE s.files[f].owner
        rec(f) == [file |-> f, actor |-> actor, owner |-> owner(f),
                   existed |-> ~gone(f), protected |-> owner(f) = User]
        bad == {rec(f) : f \in {g \in D : gone(g) \/ owner(g) = User \/ owner(g) # actor}}
    IN  [s EXCEPT !.files = Without(s.files, D),
                  !.deleted = s.deleted \cup D,
                  !.badDeletes = s.badDeletes \cup bad]

(* _delete_file for each file of F: waits (R64) or deletes.                *)
DeleteFiles(s, F, actor) ==
    LET wait(f) == IF f \in DOMAIN s.files THEN WaitsFor(s, s.files[f].creator, actor) ELSE 0
        W == {f \in F : wait(f) # 0}
        queued == {x.file : x \in {y \in s.deferred : ~y.isDir}}
        new == {[actor |-> actor, file |-> f, dir |-> NoDir, isDir |-> FALSE,
                 waitsFor |-> wait(f)] : f \in W \ queued}
    IN  RemoveFiles([s EXCEPT !.deferred = s.deferred \cup new], F \ W, actor)

(* _delete_dir: a managed directory with everything in it (R42).           *)
DeleteDir(s, d, actor) ==
    LET inside == {f \in DOMAIN s.files : s.files[f].dir = d}
        creator == IF d \in DOMAIN s.dirs THEN s.dirs[d].creator ELSE 0
        waits == ({WaitsFor(s, creator, actor)}
                    \cup {WaitsFor(s, s.files[f].creator, actor) : f \in inside}) \ {0}
        queued == \E y \in s.deferred : y.isDir /\ y.dir = d
    IN  IF waits # {}
        THEN IF queued THEN s
             ELSE [s EXCEPT !.deferred = s.deferred \cup
                      {[actor |-> actor, file |-> NoFile, dir |-> d, isDir |-> TRUE,
                        waitsFor |-> MinOf(waits)]}]
        ELSE LET s1 == RemoveFiles(s, inside, actor)
             IN  [s1 EXCEPT !.dirs = Without(s1.dirs, {d})]

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* A TM's file-merging manager: physical files and segments.               *)
(***************************************************************************)

(* R15, R80, R81 (_check_file): mark a file over the amplification bound   *)
(* not reusable, closing it if it is a pooled open file; delete a closed   *)
(* file with ref count 0 that the TM owns.                                 *)
CheckFile(s, t, f) ==
    IF f \notin DOMAIN s.pfiles[t] THEN s
    ELSE LET pf0 == s.pfiles[t][f]
             amp == AmpBound > 0 /\ pf0.size > AmpBound * pf0.live
             pf == IF amp THEN [pf0 EXCEPT !.reusable = FALSE, !.open = FALSE] ELSE pf0
             s1 == IF amp /\ pf0.open THEN CloseStorage(s, f) ELSE s
         IN  IF ~pf.open /\ pf.ref = 0
             THEN LET s2 == [s1 EXCEPT !.pfiles[t] = Without(s1.pfiles[t], {f})]
                  IN  IF f \in DOMAIN s2.files /\ s2.files[f].owner = t
                      THEN DeleteFiles(s2, {f}, t)
                      ELSE s2
             ELSE [s1 EXCEPT !.pfiles[t][f] = pf]

CheckFiles(s, t, F) == FoldSet(LAMBDA x, f : CheckFile(x, t, f), s, F)

(* _close_pfile: take the file out of its pool, close it, check it.        *)
ClosePFile(s, t, f) ==
    IF f \in DOMAIN s.pfiles[t] /\ s.pfiles[t][f].open
    THEN CheckFile(CloseStorage([s EXCEPT !.pfiles[t][f].open = FALSE], f), t, f)
    ELSE CheckFile(s, t, f)

(* R14 (_close_within_files): close the WITHIN files of checkpoints in C   *)
(* pooled for subtasks in S (S = Nat: all).                                *)
CloseWithin(s, t, C, S) ==
    LET F == {f \in DOMAIN s.pfiles[t] :
                /\ s.pfiles[t][f].open
                /\ s.pfiles[t][f].ckpt # 0
                /\ s.pfiles[t][f].ckpt \in C
                /\ s.pfiles[t][f].sub \in S}
    IN  FoldSet(LAMBDA x, f : ClosePFile(x, t, f), s, F)

(* R33 (_discard): drop the segments L from t's table, once each, and      *)
(* decrement their files' ref counts; then check those files.              *)
Discard(s, t, L) ==
    LET D == L \cap DOMAIN s.segs[t]
        F == {s.segs[t][l].file : l \in D}
        n(f) == Cardinality({l \in D : s.segs[t][l].file = f})
        pf2(f) == [s.pfiles[t][f] EXCEPT !.ref = @ - n(f), !.live = @ - n(f) * SegSize]
        s1 == [s EXCEPT !.segs[t] = Without(s.segs[t], D),
                        !.pfiles[t] = [f \in DOMAIN s.pfiles[t] |->
                                          IF f \in F THEN pf2(f) ELSE s.pfiles[t][f]]]
    IN  CheckFiles(s1, t, F)

(* The open pooled file of (t, subtask i, checkpoint c), if any (R13, R14: *)
(* SHARED state is pooled per subtask; WITHIN per checkpoint).             *)
PoolCkpt(c) == IF Mode = "WITHIN" THEN c ELSE 0
PoolFiles(s, t, i, c) ==
    {f \in DOMAIN s.pfiles[t] :
        s.pfiles[t][f].open /\ s.pfiles[t][f].sub = i /\ s.pfiles[t][f].ckpt = PoolCkpt(c)}

(* R12, R40 (_append_segment): append n bytes of a SegSize stream to the   *)
(* pooled file, creating the directory at the first write and rolling      *)
(* the pooled file before it would exceed MaxFileSize.  Returns the new    *)
(* state, the file and the offset.                                         *)
AppendSegment(s, t, i, c, n) ==
    LET d == SharedDir(s.job, s.par, i)
        s1 == IF d \in DOMAIN s.dirs THEN s
              ELSE [s EXCEPT !.dirs = Put(s.dirs, d, [owner |-> t, creator |-> t,
                                                      usedBy |-> {}, handedOver |-> FALSE])]
        P1 == PoolFiles(s1, t, i, c)
        roll == \E f \in P1 : s1.pfiles[t][f].size > 0
                              /\ s1.pfiles[t][f].size + SegSize > MaxFileSize
        s2 == IF roll THEN ClosePFile(s1, t, CHOOSE f \in P1 : TRUE) ELSE s1
        P2 == PoolFiles(s2, t, i, c)
        new == DataFile(s2.nextFile)
        s3 == IF P2 # {} THEN s2
              ELSE [s2 EXCEPT !.nextFile = s2.nextFile + 1,
                              !.files = Put(s2.files, new, [dir |-> d, owner |-> t,
                                              creator |-> t, open |-> TRUE, size |-> 0]),
                              !.pfiles[t] = Put(s2.pfiles[t], new,
                                              [open |-> TRUE, ref |-> 0, live |-> 0,
                                               size |-> 0, reusable |-> TRUE, sub |-> i,
                                               ckpt |-> PoolCkpt(c), dir |-> d])]
        f == IF P2 # {} THEN CHOOSE x \in P2 : TRUE ELSE new
        off == s3.files[f].size
    IN  [st |-> [s3 EXCEPT !.files[f].size = @ + n, !.pfiles[t][f].size = @ + n],
         file |-> f, off |-> off]

(* R10, R11, R12 (_write_stream): write one SegSize stream of subtask i    *)
(* for checkpoint c; returns the new state and the entry.  Without         *)
(* merging the file is its own (closed before the handle exists); with     *)
(* merging it is a new segment with lastUsed = c in the pooled file.       *)
WriteStream(s, t, i, c) ==
    LET lid == s.nextLid
        d == SharedDir(s.job, s.par, i)
        s0 == [s EXCEPT !.nextLid = s.nextLid + 1]
    IN  IF Mode = "NONE"
        THEN LET f == DataFile(s0.nextFile)
             IN  [st |-> [s0 EXCEPT !.nextFile = s0.nextFile + 1,
                                    !.files = Put(s0.files, f, [dir |-> d, owner |-> t,
                                                  creator |-> t, open |-> FALSE,
                                                  size |-> SegSize])],
                  e |-> Entry("file", f, 0, lid, d, i)]
        ELSE LET a == AppendSegment(s0, t, i, c, SegSize)
                 f == a.file
                 s1 == [a.st EXCEPT !.segs[t] = Put(a.st.segs[t], lid,
                                         [file |-> f, off |-> a.off, sub |-> i,
                                          createdFor |-> c, lastUsed |-> c,
                                          confirmed |-> FALSE]),
                                    !.pfiles[t][f].ref = @ + 1,
                                    !.pfiles[t][f].live = @ + SegSize]
                 s2 == IF s1.pfiles[t][f].open /\ s1.pfiles[t][f].size >= MaxFileSize
                       THEN ClosePFile(s1, t, f) ELSE s1
             IN  [st |-> s2, e |-> Entry("seg", f, a.off, lid, d, i)]

(* _add_output: the entry waits for the acknowledgement; the backend       *)
(* remembers it, unconfirmed (R20).                                        *)
AddOutput(s, t, i, c, e) ==
    [s EXCEPT !.outputs = s.outputs \cup {[tm |-> t, sub |-> i, cp |-> c, e |-> e]},
              !.backend[t] = Put(s.backend[t], i, [e |-> e, ckpt |-> c, confirmed |-> FALSE])]

(* _tm_drop_outputs for one output: discard what was written and never     *)
(* acknowledged (R31, R32).                                                *)
DropOne(s, o) ==
    LET t == o.tm
        e == o.e
        s1 == [s EXCEPT !.outputs = s.outputs \ {o}]
        ref == IF o.sub \in DOMAIN s1.backend[t] THEN s1.backend[t][o.sub] ELSE NoRef
    IN  IF e.kind = "file"
        THEN LET s2 == IF e.file \in DOMAIN s1.files /\ s1.files[e.file].owner = t
                       THEN DeleteFiles(s1, {e.file}, t) ELSE s1
             IN  IF ref.e = e THEN [s2 EXCEPT !.backend[t] = Without(s2.backend[t], {o.sub})]
                 ELSE s2
        ELSE IF e.kind = "seg"
        THEN LET s2 == IF /\ e.lid \in DOMAIN s1.segs[t]
                          /\ s1.segs[t][e.lid].createdFor = o.cp
                          /\ s1.segs[t][e.lid].lastUsed <= o.cp
                       THEN Discard(s1, t, {e.lid}) ELSE s1
             IN  IF ref.e = e /\ ~ref.confirmed
                 THEN [s2 EXCEPT !.backend[t] = Without(s2.backend[t], {o.sub})]
                 ELSE s2
        ELSE s1

(* _tm_drop_outputs_where: t's outputs of checkpoints in C, subtasks in S. *)
DropOutputs(s, t, C, S) ==
    FoldSet(DropOne, s, {o \in s.outputs : o.tm = t /\ o.cp \in C /\ o.sub \in S})

(* R41 (_tm_release_dirs): a TM deletes a directory it created only if     *)
(* every checkpoint that reported it is known aborted (a SET of ids, not   *)
(* a counter: FLINK-38347) and nothing lies in it.                         *)
Releasable(s, t, d) ==
    /\ s.dirs[d].creator = t
    /\ ~s.dirs[d].handedOver
    /\ s.dirs[d].usedBy # {}
    /\ s.dirs[d].owner = t
    /\ s.dirs[d].usedBy \subseteq s.tms[t].knownAborted
    /\ ~\E f \in DOMAIN s.pfiles[t] : s.pfiles[t][f].dir = d
    /\ ~\E f \in DOMAIN s.files : s.files[f].dir = d

ReleaseDirs(s, t) ==
    FoldSet(LAMBDA x, d : DeleteDir(x, d, t), s, {d \in DOMAIN s.dirs : Releasable(s, t, d)})

(* R23 (_confirm) for one acknowledgement a of the completed checkpoint:   *)
(* what it acknowledged becomes the subtask's reusable baseline; a name    *)
(* not in it that is not newer is forgotten.                               *)
ConfirmOne(s, a) ==
    LET t == a.tm
        i == a.sub
        s1 == IF i \notin DOMAIN s.backend[t] THEN s
              ELSE IF a.e.kind # "none"
              THEN [s EXCEPT !.backend[t][i] =
                       [e |-> IF a.e.kind = "ph" THEN s.backend[t][i].e ELSE a.e,
                        ckpt |-> MaxOf({s.backend[t][i].ckpt, a.cp}),
                        confirmed |-> TRUE]]
              ELSE IF s.backend[t][i].ckpt <= a.cp
              THEN [s EXCEPT !.backend[t] = Without(s.backend[t], {i})]
              ELSE s
    IN  IF a.e.kind = "seg" /\ a.e.lid \in DOMAIN s1.segs[t]
        THEN [s1 EXCEPT !.segs[t][a.e.lid].confirmed = TRUE]
        ELSE s1

Confirm(s, t, c) ==
    LET s1 == FoldSet(ConfirmOne, s, {a \in s.acked : a.tm = t /\ a.cp = c})
    IN  [s1 EXCEPT !.acked = {a \in s1.acked : ~(a.tm = t /\ a.cp < c)}]

(* R31 (tm_complete): on complete(c, k) confirm c, discard every segment   *)
(* with lastUsed <= k, drop unacknowledged writes of checkpoints <= c and  *)
(* close WITHIN files of checkpoints <= c.                                 *)
TmComplete(s, t, c, k) ==
    LET s1 == [s EXCEPT !.tms[t].finishedMark = MaxOf({@, c})]
        s2 == Confirm(s1, t, c)
        s3 == Discard(s2, t, {l \in DOMAIN s2.segs[t] : s2.segs[t][l].lastUsed <= k})
        s4 == DropOutputs(s3, t, 1..c, Nat)
    IN  CloseWithin(s4, t, 1..c, Nat)

(* R32 (tm_abort, before R41): on abort(c, L) learn L completed, discard   *)
(* the segments created for c with lastUsed <= c and unacknowledged        *)
(* writes for c, close WITHIN files of c.                                  *)
TmAbortCore(s, t, c, L) ==
    LET s1 == [s EXCEPT !.tms[t].knownAborted = @ \cup {c}]
        s2 == IF L > 0 THEN Confirm(s1, t, L) ELSE s1
        s3 == Discard(s2, t, {l \in DOMAIN s2.segs[t] :
                                 s2.segs[t][l].createdFor = c /\ s2.segs[t][l].lastUsed <= c})
        s4 == DropOutputs(s3, t, {c}, Nat)
    IN  CloseWithin(s4, t, {c}, Nat)

TmAbort(s, t, c, L) == ReleaseDirs(TmAbortCore(s, t, c, L), t)

(* _forget_tm: a TM that is gone keeps no memory; notices to it go.        *)
ForgetTm(s, t) ==
    [s EXCEPT !.segs[t] = EmptyFn, !.pfiles[t] = EmptyFn, !.backend[t] = EmptyFn,
              !.outputs = {o \in s.outputs : o.tm # t},
              !.acked = {a \in s.acked : a.tm # t},
              !.channel = [n \in {m \in DOMAIN s.channel : m.tm # t} |-> s.channel[n]]]

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* The coordinator: notifications, registry, retention, directories.       *)
(***************************************************************************)

(* R30: a notice for every live TM of the job.                             *)
Notify(s, kind, c, mark) ==
    [s EXCEPT !.channel = BagAddAll(s.channel, {[tm |-> t, kind |-> kind, ckpt |-> c,
                                                 mark |-> mark] : t \in CurrentTms(s)})]

(* R54 (_release_entry): an entry no retained checkpoint refers to and no  *)
(* pending one pins goes; the coordinator deletes the file if it owns it.  *)
ReleaseEntries(s, K) ==
    LET R == {k \in K \cap DOMAIN s.registry :
                 s.registry[k].refs = {} /\ s.registry[k].pins = {}}
        F == {s.registry[k].file : k \in {k2 \in R : s.registry[k2].owned}}
        s1 == [s EXCEPT !.registry = Without(s.registry, R)]
    IN  DeleteFiles(s1, {f \in F : f \in DOMAIN s1.files /\ s1.files[f].owner = Coord}, Coord)

(* R22, R30, R43 (coordinator_abort): drop the pending checkpoint, unpin   *)
(* its placeholders, delete what its acknowledgements handed over, tell    *)
(* the TMs abort(c, latest completed).                                     *)
CoordAbort(s, c) ==
    LET p == s.pending[c]
        pinned == {k \in DOMAIN s.registry : c \in s.registry[k].pins}
        s1 == [s EXCEPT !.pending = Without(s.pending, {c}),
                        !.registry = [k \in DOMAIN s.registry |->
                                         IF k \in pinned
                                         THEN [s.registry[k] EXCEPT !.pins = @ \ {c}]
                                         ELSE s.registry[k]]]
        s2 == ReleaseEntries(s1, pinned)
        s3 == DeleteFiles(s2, {f \in p.received :
                                  f \in DOMAIN s2.files /\ s2.files[f].owner = Coord}, Coord)
    IN  Notify(s3, "abort", c, s3.latestCompleted)

AbortAll(s, C) == FoldInOrder(CoordAbort, s, C)

(* R54, R42 (_register): registry entries keyed by unique logical ids,     *)
(* refs = retained checkpoint ids; a reported directory becomes the        *)
(* coordinator's (FLINK-35784).                                            *)
Register(s, r) ==
    LET E == {e \in r.entries : e.kind \in {"seg", "file"}}
        L == {e.lid : e \in E}
        entryOf(l) == CHOOSE e \in E : e.lid = l
        old(l) == IF l \in DOMAIN s.registry THEN s.registry[l]
                  ELSE [file |-> NoFile, entry |-> NoEntry, refs |-> {}, owned |-> FALSE,
                        pins |-> {}]
        new(l) == [file |-> entryOf(l).file, entry |-> entryOf(l),
                   refs |-> old(l).refs \cup {r.id}, owned |-> entryOf(l).kind = "file",
                   pins |-> old(l).pins \ {r.id}]
        oldDir(d) == IF d \in DOMAIN s.dirs THEN s.dirs[d]
                     ELSE [owner |-> Coord, creator |-> 0, usedBy |-> {}, handedOver |-> TRUE]
    IN  [s EXCEPT !.registry = [l \in DOMAIN s.registry \cup L |->
                                   IF l \in L THEN new(l) ELSE s.registry[l]],
                  !.dirReg = [d \in DOMAIN s.dirReg \cup r.dirs |->
                                 (IF d \in DOMAIN s.dirReg THEN s.dirReg[d] ELSE {})
                                   \cup (IF d \in r.dirs THEN {r.id} ELSE {})],
                  !.dirs = [d \in DOMAIN s.dirs \cup r.dirs |->
                               IF d \in r.dirs
                               THEN [oldDir(d) EXCEPT !.handedOver = TRUE, !.owner = Coord]
                               ELSE s.dirs[d]]]

(* R52, R54 (_subsume): drop a checkpoint's references, delete what        *)
(* nobody refers to, and its metadata.  (Exclusive files: not modelled.)   *)
Subsume(s, r) ==
    LET K == {e.lid : e \in {x \in r.entries : x.kind \in {"seg", "file"}}} \cap DOMAIN s.registry
        s1 == [s EXCEPT !.watermark = MaxOf({@, r.id}),
                        !.registry = [k \in DOMAIN s.registry |->
                                         IF k \in K
                                         THEN [s.registry[k] EXCEPT !.refs = @ \ {r.id}]
                                         ELSE s.registry[k]],
                        !.dirReg = [d \in DOMAIN s.dirReg |->
                                       IF d \in r.dirs THEN s.dirReg[d] \ {r.id}
                                       ELSE s.dirReg[d]]]
        s2 == ReleaseEntries(s1, K)
        s3 == [s2 EXCEPT !.dirReg = Without(s2.dirReg,
                                            {d \in r.dirs \cap DOMAIN s2.dirReg : s2.dirReg[d] = {}})]
    IN  IF r.meta \in DOMAIN s3.files /\ s3.files[r.meta].owner = Coord
        THEN DeleteFiles(s3, {r.meta}, Coord) ELSE s3

SubsumeOldest(s) ==
    LET r == CHOOSE x \in s.retained : \A y \in s.retained : x.id <= y.id
    IN  Subsume([s EXCEPT !.retained = s.retained \ {r}], r)

(* R42 (_collect_dirs): the coordinator deletes a directory it owns once   *)
(* no retained checkpoint refers to it, no live TM of the job works in it  *)
(* (manages it, holding a file there yet or not, or holds a file there)    *)
(* and everything in it is the coordinator's (or its creator's).           *)
Collectable(s, d) ==
    LET live == CurrentTms(s)
    IN  /\ s.dirs[d].owner = Coord
        /\ d \notin UNION {r.dirs : r \in s.retained}
        /\ d \notin DOMAIN s.dirReg
        /\ ~(s.dirs[d].creator \in live /\ s.running)
        /\ ~(s.running /\ \E i \in DOMAIN s.placement :
                s.placement[i] \in live /\ d = SharedDir(s.job, s.par, i))
        /\ ~\E t \in live : \E f \in DOMAIN s.pfiles[t] : s.pfiles[t][f].dir = d
        /\ \A f \in DOMAIN s.files :
               s.files[f].dir = d => s.files[f].owner \in {Coord, s.files[f].creator}

CollectDirs(s) ==
    FoldSet(LAMBDA x, d : DeleteDir(x, d, Coord), s, {d \in DOMAIN s.dirs : Collectable(s, d)})

(* R44, R45, R64: a waiting delete is carried out by whoever owns the path *)
(* when it runs; what became the user's is never deleted. A directory goes *)
(* only if its owner's rule still allows it then (R41 for a TM, R42 for    *)
(* the coordinator): while it waited, a new attempt may have written into  *)
(* it and a retained checkpoint may refer to it.                           *)
RunDeferred(s, x) ==
    IF x.isDir
    THEN IF x.dir \in DOMAIN s.dirs /\ s.dirs[x.dir].owner # User
         THEN LET o == s.dirs[x.dir].owner
                  ok == IF o = Coord THEN Collectable(s, x.dir) ELSE Releasable(s, o, x.dir)
              IN  IF ok THEN DeleteDir(s, x.dir, o) ELSE s
         ELSE s
    ELSE IF x.file \in DOMAIN s.files /\ s.files[x.file].owner # User
         THEN DeleteFiles(s, {x.file}, s.files[x.file].owner) ELSE s

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* Commands as pure operators on the state record (refimpl _Work methods). *)
(***************************************************************************)
Calm0(s) == [s EXCEPT !.calm = 0]

(* R10, R56, R64 (writer_tm): may TM t write for (or acknowledge)          *)
(* checkpoint c of subtask i?  zombie: t is a lost attempt acting on its   *)
(* own (BRIEF §4).                                                         *)
FinishedFor(s, t, c) ==
    \/ c \in s.tms[t].knownAborted
    \/ c < s.tms[t].firstCkpt
    \/ c <= s.tms[t].finishedMark

WriterOk(s, t, i, c, zombie) ==
    /\ s.running
    /\ i \in DOMAIN s.placement
    /\ 1 <= c /\ c < s.nextCkpt
    /\ t \in DOMAIN s.tms
    /\ IF zombie THEN s.tms[t].status = "lost" /\ i \in s.tms[t].hosted
                 ELSE t = s.placement[i] /\ s.tms[t].status = "alive"
    /\ ~FinishedFor(s, t, c)
    /\ ~\E a \in s.acked : a.tm = t /\ a.sub = i /\ a.cp = c

(* The model writes (or reuses) the one "sst" state at most once per       *)
(* checkpoint and subtask (refimpl allows more writes of other names).     *)
HasOutput(s, t, i, c) == \E o \in s.outputs : o.tm = t /\ o.sub = i /\ o.cp = c

(* R50: Trigger.  (Savepoints are not modelled.)                           *)
DoTrigger(s) ==
    [s EXCEPT !.pending = Put(s.pending, s.nextCkpt, [acks |-> EmptyFn, received |-> {}]),
              !.nextCkpt = s.nextCkpt + 1]

(* R10-R13: WriteState.                                                    *)
DoWrite(s, t, i, c) ==
    LET w == WriteStream(s, t, i, c)
    IN  AddOutput(w.st, t, i, c, w.e)

(* R20 (_reusable): only state of a checkpoint the TM knows completed      *)
(* (FLINK-25395), in a segment it still tracks in a reusable file          *)
(* (FLINK-35803, R80); without merging the registry decides (R22).         *)
Reusable(s, t, ref) ==
    /\ ref.confirmed
    /\ IF ref.e.kind = "seg"
       THEN /\ ref.e.lid \in DOMAIN s.segs[t]
            /\ ref.e.file \in DOMAIN s.pfiles[t]
            /\ s.pfiles[t][ref.e.file].reusable
       ELSE ref.e.kind = "file" /\ Mode = "NONE"

(* R20, R21, R22 (reuse_shared) with the reuse test Ok and whether reuse   *)
(* advances lastUsed as parameters, so a must-fail model can swap them.    *)
DoReuseWith(s, t, i, c, Ok(_, _, _), advance) ==
    LET ref == s.backend[t][i]
    IN  IF Ok(s, t, ref)
        THEN LET e == IF ref.e.kind = "seg" THEN ref.e
                      ELSE Entry("ph", NoFile, 0, ref.e.lid, SharedDir(s.job, s.par, i), i)
                 s1 == IF ref.e.kind = "seg" /\ advance
                       THEN [s EXCEPT !.segs[t][ref.e.lid].lastUsed = MaxOf({@, c})]
                       ELSE s
             IN  [s1 EXCEPT !.outputs = s1.outputs \cup {[tm |-> t, sub |-> i, cp |-> c, e |-> e]},
                            !.backend[t][i].ckpt = MaxOf({@, c})]
        ELSE DoWrite(s, t, i, c)    \* R20: not reusable: upload the same state again

DoReuse(s, t, i, c) == DoReuseWith(s, t, i, c, Reusable, TRUE)

(* R40, R43, R56, R22 (acknowledge).  The ack reports the subtask's shared *)
(* directory if it exists (the TM's taskowned/ directory: not modelled).   *)
DoAck(s, t, i, c, zombie) ==
    LET outs == {o \in s.outputs : o.tm = t /\ o.sub = i /\ o.cp = c}
        sst == IF outs = {} THEN NoEntry ELSE (CHOOSE o \in outs : TRUE).e
        d == SharedDir(s.job, s.par, i)
        hasDir == Mode # "NONE" /\ d \in DOMAIN s.dirs
        ents == (IF outs = {} THEN {} ELSE {sst})
                  \cup (IF hasDir THEN {Entry("dir", NoFile, 0, 0, d, i)} ELSE {})
        s1 == [s EXCEPT !.outputs = s.outputs \ outs,
                        !.dirs = IF hasDir /\ s.dirs[d].creator = t
                                 THEN [s.dirs EXCEPT ![d].usedBy = @ \cup {c}]
                                 ELSE s.dirs,
                        !.acked = s.acked \cup {[tm |-> t, sub |-> i, cp |-> c, e |-> sst]}]
        s2 == CloseWithin(s1, t, {c}, {i})
        FE == {e \in ents : e.kind = "file"}
        taken == {e.file : e \in FE} \cap DOMAIN s2.files
        s3 == [s2 EXCEPT !.files = [f \in DOMAIN s2.files |->       \* R43: files handed over
                                       IF f \in taken THEN [s2.files[f] EXCEPT !.owner = Coord]
                                       ELSE s2.files[f]]]
    IN  IF zombie THEN s2                           \* R56: ignored
        ELSE IF c \notin DOMAIN s2.pending
        THEN DeleteFiles(s3, {e.file : e \in FE}, Coord)   \* R43: a late ack hands over too
        ELSE LET s4 == [s3 EXCEPT !.pending[c].acks = Put(@, i, ents),
                                  !.pending[c].received = @ \cup taken]
                 resolves == \A e \in ents : e.kind = "ph" => e.lid \in DOMAIN s4.registry
                 phs == {e.lid : e \in {x \in ents : x.kind = "ph"}}
             IN  IF ~resolves THEN CoordAbort(s4, c)        \* R22: gone entry aborts
                 ELSE [s4 EXCEPT !.registry = [k \in DOMAIN s4.registry |->   \* R22: pin
                                                  IF k \in phs
                                                  THEN [s4.registry[k] EXCEPT !.pins = @ \cup {c}]
                                                  ELSE s4.registry[k]]]

(* R17, R14 (_write_failed via decline): the subtask declines c.           *)
DoDecline(s, t, i, c) ==
    LET s1 == DropOutputs(s, t, {c}, {i})
        s2 == [s1 EXCEPT !.acked = s1.acked \cup {[tm |-> t, sub |-> i, cp |-> c, e |-> NoEntry]}]
        s3 == CloseWithin(s2, t, {c}, {i})
    IN  Calm0(IF c \in DOMAIN s3.pending /\ s3.tms[t].status = "alive"
              THEN CoordAbort(s3, c) ELSE s3)

(* R51-R54, R30, R42 (complete): resolve placeholders, write _metadata,    *)
(* register, retain, subsume the oldest beyond NumRetained, notify, abort  *)
(* older pending checkpoints, collect directories.  (A failing metadata    *)
(* write, R51, is not modelled.)                                           *)
CanComplete(s, c) ==
    /\ s.running
    /\ c \in DOMAIN s.pending
    /\ DOMAIN s.placement \subseteq DOMAIN s.pending[c].acks

Settled(s) ==
    /\ DOMAIN s.channel = {}
    /\ LostTms(s) = {}
    /\ s.deferred = {}

DoComplete(s, c) ==
    LET p == s.pending[c]
        all == UNION {p.acks[i] : i \in DOMAIN p.acks}
        resolve(e) == IF e.kind = "ph" THEN [s.registry[e.lid].entry EXCEPT !.sub = e.sub] ELSE e
        ents == {resolve(e) : e \in {x \in all : x.kind # "dir"}}
        ds == {e.dir : e \in {x \in all : x.kind = "dir"}}
        m == MetaFile(c)
        r == [id |-> c, job |-> s.job, entries |-> ents, dirs |-> ds, meta |-> m]
        calm2 == IF Settled(s) /\ DOMAIN s.pending = {c}
                 THEN MinOf({s.calm + 1, NumRetained + 1}) ELSE 0
        s1 == [s EXCEPT !.files = Put(s.files, m, [dir |-> NoDir, owner |-> Coord, creator |-> 0,
                                                   open |-> FALSE, size |-> 0]),
                        !.pending = Without(s.pending, {c}),
                        !.restoring = {},
                        !.latestCompleted = c,
                        !.calm = calm2]
        s2 == Register(s1, r)
        s3 == [s2 EXCEPT !.retained = s2.retained \cup {r}]
        s4 == IF Cardinality(s3.retained) > NumRetained THEN SubsumeOldest(s3) ELSE s3
        s5 == Notify(s4, "complete", c, s4.watermark)
        s6 == AbortAll(s5, {k \in DOMAIN s5.pending : k < c})     \* R53
    IN  CollectDirs(s6)

(* R34 (deliver) with the abort handler as a parameter: a stopped TM hears *)
(* nothing; a lost one (a zombie) still applies what was sent to it.       *)
DeliverWith(s, n, OnAbort(_, _, _, _)) ==
    LET s1 == [s EXCEPT !.channel = BagRemove(s.channel, n)]
        t == n.tm
    IN  IF t \notin DOMAIN s1.tms \/ s1.tms[t].status = "stopped" THEN s1
        ELSE IF n.kind = "complete" THEN TmComplete(s1, t, n.ckpt, n.mark)
        ELSE OnAbort(s1, t, n.ckpt, n.mark)

DoDeliver(s, n) == DeliverWith(s, n, TmAbort)

(* R57 (_lose): a lost TM's subtasks can acknowledge nothing more: every   *)
(* pending checkpoint is aborted.                                          *)
Lose(s, t) ==
    LET s1 == [s EXCEPT !.tms[t].status = "lost", !.tms[t].hosted = HostedBy(s, t)]
    IN  Calm0(AbortAll(s1, DOMAIN s1.pending))

(* R65 (crash_during_write): PartialSize bytes of a stream, no handle,     *)
(* then the TM is lost.                                                    *)
DoCrashDuringWrite(s, t, i, c) ==
    LET s0 == [s EXCEPT !.nextLid = s.nextLid + 1]
        f == DataFile(s0.nextFile)
        s1 == IF Mode = "NONE"
              THEN [s0 EXCEPT !.nextFile = s0.nextFile + 1,
                              !.files = Put(s0.files, f, [dir |-> SharedDir(s.job, s.par, i),
                                            owner |-> t, creator |-> t, open |-> TRUE,
                                            size |-> PartialSize])]
              ELSE AppendSegment(s0, t, i, c, PartialSize).st
    IN  Lose(s1, t)

(* R64 (_drop_empty_dirs): a directory taken from a stopped attempt that a *)
(* live attempt works in (its subtask's shared one, R66) goes once nothing *)
(* lies in it; the stopped attempt may have deleted it unseen (R41).       *)
DropsEmpty(s, d) ==
    /\ d \in DOMAIN s.dirs
    /\ s.dirs[d].owner = Coord
    /\ s.running
    /\ \E i \in DOMAIN s.placement :
           s.placement[i] \in CurrentTms(s) /\ d = SharedDir(s.job, s.par, i)
    /\ d \notin UNION {r.dirs : r \in s.retained}
    /\ d \notin DOMAIN s.dirReg
    /\ ~\E f \in DOMAIN s.files : s.files[f].dir = d

(* R64 (attempt_stopped): what waited for t is deleted; the coordinator    *)
(* takes what t still owned and deletes what nothing references.           *)
DoAttemptStopped(s, t) ==
    LET s1 == [s EXCEPT !.tms[t].status = "stopped", !.tms[t].hosted = {},
                        !.files = [f \in DOMAIN s.files |->
                                      IF s.files[f].creator = t
                                      THEN [s.files[f] EXCEPT !.open = FALSE]
                                      ELSE s.files[f]]]
        s2 == ForgetTm(s1, t)
        formerly == {f \in DOMAIN s2.files : s2.files[f].owner = t}
        s3 == [s2 EXCEPT !.files = [f \in DOMAIN s2.files |->
                                       IF f \in formerly THEN [s2.files[f] EXCEPT !.owner = Coord]
                                       ELSE s2.files[f]],
                         !.dirs = [d \in DOMAIN s2.dirs |->
                                      IF s2.dirs[d].owner = t THEN [s2.dirs[d] EXCEPT !.owner = Coord]
                                      ELSE s2.dirs[d]]]
        waiting == {x \in s3.deferred : x.waitsFor = t}
        s4 == FoldSet(RunDeferred, [s3 EXCEPT !.deferred = s3.deferred \ waiting], waiting)
        s5 == DeleteFiles(s4, {f \in formerly : f \in DOMAIN s4.files /\ ~Referenced(s4, f)}, Coord)
        taken == {d \in DOMAIN s2.dirs : s2.dirs[d].owner = t}
        s6 == FoldSet(LAMBDA x, d : IF DropsEmpty(x, d) THEN DeleteDir(x, d, Coord) ELSE x,
                      s5, taken)
    IN  CollectDirs(s6)

(* The backend reloads the latest completed checkpoint's state (R23).     *)
ReloadBackend(s, t, hosted) ==
    IF s.retained = {} THEN s
    ELSE LET latest == CHOOSE r \in s.retained : \A x \in s.retained : r.id >= x.id
             E == {e \in latest.entries :
                      /\ e.sub \in hosted
                      /\ \/ e.kind = "seg" /\ e.lid \in DOMAIN s.segs[t]
                         \/ e.kind = "file" /\ Mode = "NONE"}
             subs == {e.sub : e \in E}
         IN  IF latest.job # s.job THEN s
             ELSE [s EXCEPT !.backend[t] = [i \in DOMAIN s.backend[t] \cup subs |->
                                              IF i \in subs
                                              THEN [e |-> CHOOSE e \in E : e.sub = i,
                                                    ckpt |-> latest.id, confirmed |-> TRUE]
                                              ELSE s.backend[t][i]]]

(* R61, R62 (_restore_manager) with the set R of checkpoints whose         *)
(* segments are kept as a parameter.  The TM takes over the segments R     *)
(* references in the directories it now manages (lastUsed = the newest     *)
(* checkpoint of R using it), and deletes every other TM-owned file in     *)
(* them (garbage), except a lost attempt's (R64); a directory a lost       *)
(* attempt owns stays its own until it stops (R64, R66).                   *)
RestoreManagerKeep(s, t, R) ==
    LET hosted == HostedBy(s, t)
    IN  IF Mode = "NONE" THEN ReloadBackend(s, t, hosted)
        ELSE LET managed == {SharedDir(s.job, s.par, i) : i \in hosted}
                 KE == {e \in UNION {r.entries : r \in R} : e.kind = "seg" /\ e.dir \in managed}
                 keepL == {e.lid : e \in KE}
                 eOf(l) == CHOOSE e \in KE : e.lid = l
                 ids(l) == {r.id : r \in {x \in R : \E e \in x.entries : e.lid = l}}
                 keptF == {eOf(l).file : l \in keepL}
                 nIn(f) == Cardinality({l \in keepL : eOf(l).file = f})
                 newPf(f) == [open |-> FALSE, ref |-> nIn(f), live |-> nIn(f) * SegSize,
                              size |-> IF f \in DOMAIN s.files THEN s.files[f].size ELSE 0,
                              reusable |-> TRUE, sub |-> 0, ckpt |-> 0,
                              dir |-> eOf(CHOOSE l \in keepL : eOf(l).file = f).dir]
                 s1 == [s EXCEPT
                          !.segs[t] = [l \in DOMAIN s.segs[t] \cup keepL |->
                                          IF l \in keepL
                                          THEN [file |-> eOf(l).file, off |-> eOf(l).off,
                                                sub |-> eOf(l).sub, createdFor |-> MinOf(ids(l)),
                                                lastUsed |-> MaxOf(ids(l)), confirmed |-> TRUE]
                                          ELSE s.segs[t][l]],
                          !.pfiles[t] = [f \in DOMAIN s.pfiles[t] \cup keptF |->
                                            IF f \in keptF THEN newPf(f) ELSE s.pfiles[t][f]],
                          !.files = [f \in DOMAIN s.files |->
                                        IF f \in keptF THEN [s.files[f] EXCEPT !.owner = t]
                                        ELSE s.files[f]],
                          !.dirs = [d \in DOMAIN s.dirs |->
                                       IF /\ d \in managed
                                          /\ s.dirs[d].owner # Coord
                                          /\ s.dirs[d].owner \notin LostTms(s)
                                       THEN [s.dirs[d] EXCEPT !.owner = t, !.creator = t,
                                                              !.usedBy = {}]
                                       ELSE s.dirs[d]]]
                 garbage == {f \in DOMAIN s1.files :
                                /\ s1.files[f].dir \in managed
                                /\ f \notin keptF
                                /\ s1.files[f].owner \notin {Coord, User}
                                /\ s1.tms[s1.files[f].owner].status # "lost"}
                 s2 == [s1 EXCEPT !.files = [f \in DOMAIN s1.files |->
                                                IF f \in garbage
                                                THEN [s1.files[f] EXCEPT !.owner = t]
                                                ELSE s1.files[f]]]
                 s3 == DeleteFiles(s2, garbage, t)
                 s4 == CheckFiles(s3, t, keptF)
             IN  ReloadBackend(s4, t, hosted)

(* R61: every retained checkpoint, not only the newest.                    *)
RestoreManager(s, t) == RestoreManagerKeep(s, t, s.retained)

(* R60-R62 (failover) with the restore-manager rule as a parameter: abort  *)
(* pending checkpoints, replace each lost TM by a fresh id, let survivors  *)
(* drop all in-memory state (FLINK-35400), restart every TM from the       *)
(* retained checkpoints.  (R63, the taskowned/ hand-over: not modelled.)   *)
DoFailoverWith(s, RM(_, _)) ==
    LET s1 == AbortAll(s, DOMAIN s.pending)
        placed == PlacedTms(s1)
        lost == {t \in placed : s1.tms[t].status # "alive"}
        newId(t) == s1.nextTm + Cardinality({u \in lost : u < t})
        newIds == {newId(t) : t \in lost}
        survivors == placed \ lost
        s2 == [s1 EXCEPT
                 !.nextTm = s1.nextTm + Cardinality(lost),
                 !.tms = [u \in DOMAIN s1.tms \cup newIds |->
                             IF u \in newIds THEN NewTm(s1.nextCkpt, 0) ELSE s1.tms[u]],
                 !.segs = [u \in DOMAIN s1.segs \cup newIds |->
                              IF u \in newIds THEN EmptyFn ELSE s1.segs[u]],
                 !.pfiles = [u \in DOMAIN s1.pfiles \cup newIds |->
                                IF u \in newIds THEN EmptyFn ELSE s1.pfiles[u]],
                 !.backend = [u \in DOMAIN s1.backend \cup newIds |->
                                 IF u \in newIds THEN EmptyFn ELSE s1.backend[u]],
                 !.placement = [i \in DOMAIN s1.placement |->
                                   IF s1.placement[i] \in lost THEN newId(s1.placement[i])
                                   ELSE s1.placement[i]]]
        CloseOpen(x, t) ==
            [x EXCEPT !.files = [f \in DOMAIN x.files |->
                                    IF f \in DOMAIN x.pfiles[t] /\ x.pfiles[t][f].open
                                    THEN [x.files[f] EXCEPT !.open = FALSE]
                                    ELSE x.files[f]]]
        s3 == FoldSet(LAMBDA x, t : ForgetTm(CloseOpen(DropOutputs(x, t, Nat, Nat), t), t),
                      s2, survivors)
        s4 == FoldSet(LAMBDA x, t : [x EXCEPT !.tms[t].finishedMark = x.nextCkpt - 1,
                                              !.tms[t].firstCkpt = x.nextCkpt],
                      s3, PlacedTms(s3))
        s5 == FoldSet(RM, s4, PlacedTms(s4))
    IN  Calm0(CollectDirs(s5))

DoFailover(s) == DoFailoverWith(s, RestoreManager)

(* R66, R56 (_withdraw_acks) for pending checkpoint c: the acknowledgements *)
(* of subtasks I (a replaced attempt's) are withdrawn with what they       *)
(* handed over: the pins of their placeholders (R22) and their whole files *)
(* (R43), which the coordinator deletes once the attempt stopped (R64).    *)
WithdrawOne(s, c, I) ==
    LET p == s.pending[c]
        gone == I \cap DOMAIN p.acks
        ents == UNION {p.acks[i] : i \in gone}
        acks2 == Without(p.acks, gone)
        handed == {e.file : e \in {x \in ents : x.kind = "file"}} \cap p.received
        still == {e.lid : e \in {x \in UNION {acks2[i] : i \in DOMAIN acks2} : x.kind = "ph"}}
        K == ({e.lid : e \in {x \in ents : x.kind = "ph"}} \ still)
               \cap {k \in DOMAIN s.registry : c \in s.registry[k].pins}
        s1 == [s EXCEPT !.pending[c] = [acks |-> acks2, received |-> p.received \ handed],
                        !.registry = [k \in DOMAIN s.registry |->
                                         IF k \in K
                                         THEN [s.registry[k] EXCEPT !.pins = @ \ {c}]
                                         ELSE s.registry[k]]]
        s2 == ReleaseEntries(s1, K)
    IN  DeleteFiles(s2, {f \in handed : f \in DOMAIN s2.files /\ s2.files[f].owner = Coord},
                    Coord)

WithdrawAcks(s, I) == FoldInOrder(LAMBDA x, c : WithdrawOne(x, c, I), s, DOMAIN s.pending)

(* R66 (replace_tm) with the withdrawal as a parameter: task-level         *)
(* failover.  t is lost (a zombie until it stops, R64), its                *)
(* acknowledgements of pending checkpoints are withdrawn (R56), and a      *)
(* fresh TM runs t's subtasks: it may write for every pending checkpoint   *)
(* and later ones (R10: those in between that are not pending are          *)
(* aborted, R53), and starts them as a failover restarts a TM (R61, R62).  *)
(* Nothing is aborted, no other TM is reset.  (R63: not modelled.)         *)
DoReplaceTmWith(s, t, Withdraw(_, _)) ==
    LET hosted == HostedBy(s, t)
        s1 == Withdraw([s EXCEPT !.tms[t].status = "lost", !.tms[t].hosted = hosted], hosted)
        new == s1.nextTm
        first == IF DOMAIN s1.pending = {} THEN s1.nextCkpt ELSE MinOf(DOMAIN s1.pending)
        over == {k \in first..(s1.nextCkpt - 1) : k \notin DOMAIN s1.pending}
        s2 == [s1 EXCEPT
                 !.nextTm = new + 1,
                 !.tms = Put(s1.tms, new, [NewTm(first, first - 1) EXCEPT !.knownAborted = over]),
                 !.segs = Put(s1.segs, new, EmptyFn),
                 !.pfiles = Put(s1.pfiles, new, EmptyFn),
                 !.backend = Put(s1.backend, new, EmptyFn),
                 !.placement = [i \in DOMAIN s1.placement |->
                                   IF s1.placement[i] = t THEN new ELSE s1.placement[i]]]
    IN  Calm0(CollectDirs(RestoreManager(s2, new)))

DoReplaceTm(s, t) == DoReplaceTmWith(s, t, WithdrawAcks)

(* R91: the retained checkpoints, their files and directories become the   *)
(* user's.                                                                 *)
GiveToUser(s) ==
    LET paths == UNION {{r.meta} \cup {e.file : e \in r.entries} : r \in s.retained}
        ds == UNION {r.dirs : r \in s.retained}
    IN  [s EXCEPT !.files = [f \in DOMAIN s.files |->
                                IF f \in paths THEN [s.files[f] EXCEPT !.owner = User]
                                ELSE s.files[f]],
                  !.dirs = [d \in DOMAIN s.dirs |->
                               IF d \in ds THEN [s.dirs[d] EXCEPT !.owner = User]
                               ELSE s.dirs[d]]]

(* R90 for one live TM: discard what no retained checkpoint references,    *)
(* close its pools, delete directories it created that no completed        *)
(* checkpoint used, hand what remains to the coordinator, stop.            *)
EndTm(s, t, handed, keep) ==
    LET s1 == DropOutputs(s, t, Nat, Nat)
        s2 == Discard(s1, t, DOMAIN s1.segs[t] \ keep)
        s3 == FoldSet(LAMBDA x, f : ClosePFile(x, t, f), s2,
                      {f \in DOMAIN s2.pfiles[t] : s2.pfiles[t][f].open})
        doomed == {d \in DOMAIN s3.dirs :
                      /\ s3.dirs[d].creator = t
                      /\ d \notin handed
                      /\ s3.dirs[d].owner = t
                      /\ \A f \in DOMAIN s3.files : s3.files[f].dir = d => s3.files[f].owner = t}
        s4 == FoldSet(LAMBDA x, d : DeleteDir(x, d, t), s3, doomed)
        s5 == [s4 EXCEPT !.files = [f \in DOMAIN s4.files |->
                                       IF s4.files[f].owner = t
                                       THEN [s4.files[f] EXCEPT !.owner = Coord]
                                       ELSE s4.files[f]],
                         !.dirs = [d \in DOMAIN s4.dirs |->
                                      IF s4.dirs[d].owner = t
                                      THEN [s4.dirs[d] EXCEPT !.owner = Coord]
                                      ELSE s4.dirs[d]]]
        s6 == ForgetTm(s5, t)
    IN  [s6 EXCEPT !.tms[t].status = "stopped"]

(* R90, R91 (end_job): Cancel(retain), and the first half of Restore.      *)
EndJob(s, retain) ==
    LET s1 == AbortAll(s, DOMAIN s.pending)
        handed == UNION {r.dirs : r \in s1.retained}
        keep == {e.lid : e \in UNION {r.entries : r \in s1.retained}}
        s2 == FoldSet(LAMBDA x, t : EndTm(x, t, handed, keep), s1, CurrentTms(s1))
        s3 == [s2 EXCEPT !.running = FALSE, !.restoring = {}]
        s4 == IF retain THEN GiveToUser(s3)
              ELSE FoldInOrder(LAMBDA x, c :
                                   LET r == CHOOSE y \in x.retained : y.id = c
                                   IN  Subsume([x EXCEPT !.retained = x.retained \ {r}], r),
                               s3, {r.id : r \in s3.retained})
        orphans == {f \in DOMAIN s4.files : s4.files[f].owner = Coord /\ ~Referenced(s4, f)}
        s5 == DeleteFiles(s4, orphans, Coord)
    IN  CollectDirs(s5)

(* R72 (_claim): the new job's coordinator owns the restored checkpoint:   *)
(* its metadata, its files, its directories and everything in them but a   *)
(* lost attempt's files it does not reference: the zombie keeps those      *)
(* until it stops (R64); it is retained (registered, FLINK-26985) until    *)
(* subsumed.                                                               *)
Claim(s, r) ==
    LET refs == {r.meta} \cup {e.file : e \in r.entries}
        inDirs == {f \in DOMAIN s.files : /\ s.files[f].dir \in r.dirs
                                          /\ s.files[f].owner \notin LostTms(s)}
        paths == (refs \cup inDirs) \cap DOMAIN s.files
        s1 == [s EXCEPT !.files = [f \in DOMAIN s.files |->
                                      IF f \in paths THEN [s.files[f] EXCEPT !.owner = Coord]
                                      ELSE s.files[f]],
                        !.dirs = [d \in DOMAIN s.dirs |->
                                     IF d \in r.dirs THEN [s.dirs[d] EXCEPT !.owner = Coord]
                                     ELSE s.dirs[d]]]
        s2 == Register(s1, r)
    IN  [s2 EXCEPT !.retained = {r}, !.latestCompleted = r.id]

(* R70-R74 (restore): end the job keeping its checkpoints, start job + 1   *)
(* with parallelism p and fresh TMs from retained checkpoint c.  The       *)
(* restoring handles are the source's stream handles as one set: which     *)
(* new subtask reads which (R75, R76) changes no ownership (R71).          *)
DoRestore(s, c, p, mode) ==
    LET source == CHOOSE r \in s.retained : r.id = c
        s1 == IF s.running THEN EndJob(s, TRUE) ELSE s
        s2 == [s1 EXCEPT !.tms = [u \in DOMAIN s1.tms |->      \* R64: a zombie stays in its job
                                     IF s1.tms[u].status = "lost"
                                     THEN [s1.tms[u] EXCEPT !.hosted = {}]
                                     ELSE s1.tms[u]]]
        newTms == s2.nextTm..(s2.nextTm + NumTms - 1)
        s3 == [s2 EXCEPT
                 !.job = s2.job + 1, !.par = p, !.nextTm = s2.nextTm + NumTms,
                 !.tms = [u \in DOMAIN s2.tms \cup newTms |->
                             IF u \in newTms THEN NewTm(s2.nextCkpt, s2.nextCkpt - 1)
                             ELSE s2.tms[u]],
                 !.segs = [u \in DOMAIN s2.segs \cup newTms |->
                              IF u \in newTms THEN EmptyFn ELSE s2.segs[u]],
                 !.pfiles = [u \in DOMAIN s2.pfiles \cup newTms |->
                                IF u \in newTms THEN EmptyFn ELSE s2.pfiles[u]],
                 !.backend = [u \in DOMAIN s2.backend \cup newTms |->
                                 IF u \in newTms THEN EmptyFn ELSE s2.backend[u]],
                 !.placement = [i \in 0..(p - 1) |-> s2.nextTm + (i % NumTms)],
                 !.running = TRUE, !.pending = EmptyFn, !.retained = {},
                 !.registry = EmptyFn, !.dirReg = EmptyFn, !.watermark = 0,
                 !.latestCompleted = 0, !.restoring = source.entries]
        s4 == IF mode = "CLAIM" THEN Claim(s3, source) ELSE s3    \* R73: NO_CLAIM takes nothing
        FE == {e \in source.entries : e.kind = "file"}
        reuse(u) == {e.sub : e \in {x \in FE : s4.placement[x.sub] = u}}
    IN  Calm0(IF mode = "CLAIM" /\ p = s.par /\ Mode = "NONE"    \* R72: reuse via the registry
              THEN [s4 EXCEPT !.backend = [u \in DOMAIN s4.backend |->
                        IF u \in newTms
                        THEN [i \in reuse(u) |-> [e |-> CHOOSE x \in FE : x.sub = i,
                                                  ckpt |-> source.id, confirmed |-> TRUE]]
                        ELSE s4.backend[u]]]
              ELSE s4)

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* The initial state: a running job with NumTms live TMs (initial_state).  *)
(***************************************************************************)
InitState ==
    [running |-> TRUE, job |-> 1, par |-> Par0,
     placement |-> [i \in 0..(Par0 - 1) |-> (i % NumTms) + 1],
     nextCkpt |-> 1, pending |-> EmptyFn, retained |-> {}, latestCompleted |-> 0,
     watermark |-> 0, registry |-> EmptyFn, dirReg |-> EmptyFn, restoring |-> {},
     tms |-> [t \in 1..NumTms |-> NewTm(1, 0)],
     segs |-> [t \in 1..NumTms |-> EmptyFn],
     pfiles |-> [t \in 1..NumTms |-> EmptyFn],
     outputs |-> {}, acked |-> {},
     backend |-> [t \in 1..NumTms |-> EmptyFn],
     files |-> EmptyFn, dirs |-> EmptyFn, deleted |-> {}, badDeletes |-> {},
     deferred |-> {}, channel |-> EmptyFn, nextFile |-> 1, nextLid |-> 1,
     nextTm |-> NumTms + 1, calm |-> 0]

(***************************************************************************)
(* Init.                                                                   *)
(***************************************************************************)
Init == Is(InitState)

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* Trigger: the coordinator starts checkpoint nextCkpt (R50).              *)
(***************************************************************************)
Trigger ==
    /\ running
    /\ nextCkpt <= MaxCheckpoint
    /\ Goto(DoTrigger(st))

(***************************************************************************)
(* WriteState(i, c): subtask i writes its state for checkpoint c through   *)
(* a stream on its TM (R10-R14, R40).                                      *)
(***************************************************************************)
WriteState(i, c) ==
    /\ WriterOk(st, placement[i], i, c, FALSE)
    /\ ~HasOutput(st, placement[i], i, c)
    /\ Goto(DoWrite(st, placement[i], i, c))

(***************************************************************************)
(* ReuseShared(i, c): subtask i refers to its shared state uploaded        *)
(* before; reused only if R20 allows, else uploaded again (R20-R22).       *)
(***************************************************************************)
ReuseShared(i, c) ==
    /\ WriterOk(st, placement[i], i, c, FALSE)
    /\ ~HasOutput(st, placement[i], i, c)
    /\ i \in DOMAIN backend[placement[i]]
    /\ Goto(DoReuse(st, placement[i], i, c))

(***************************************************************************)
(* Acknowledge(i, c): subtask i acknowledges c with what it wrote (may be  *)
(* nothing: an empty snapshot) and its directory (R40, R43, R22, R14).     *)
(***************************************************************************)
Acknowledge(i, c) ==
    /\ WriterOk(st, placement[i], i, c, FALSE)
    /\ Goto(DoAck(st, placement[i], i, c, FALSE))

(***************************************************************************)
(* Decline(i, c): subtask i declines c; the checkpoint aborts (R17, R14).  *)
(***************************************************************************)
Decline(i, c) ==
    /\ WriterOk(st, placement[i], i, c, FALSE)
    /\ Goto(DoDecline(st, placement[i], i, c))

(***************************************************************************)
(* Complete(c): every subtask acknowledged c; it completes (R51-R54, R30,  *)
(* R42).                                                                   *)
(***************************************************************************)
Complete(c) ==
    /\ CanComplete(st, c)
    /\ Goto(DoComplete(st, c))

(***************************************************************************)
(* Abort(c): the coordinator gives up a pending checkpoint (R22, R30,      *)
(* R43).                                                                   *)
(***************************************************************************)
Abort(c) ==
    /\ running
    /\ c \in DOMAIN pending
    /\ Goto(Calm0(CoordAbort(st, c)))

(***************************************************************************)
(* DeliverNotification(n): one copy of notice n arrives at its TM, in any  *)
(* order (R31-R34).                                                        *)
(***************************************************************************)
DeliverNotification(n) ==
    /\ n \in DOMAIN channel
    /\ Goto(DoDeliver(st, n))

(***************************************************************************)
(* DropNotification(n): one copy of n is lost (R34).                       *)
(***************************************************************************)
DropNotification(n) ==
    /\ n \in DOMAIN channel
    /\ Goto(Calm0([st EXCEPT !.channel = BagRemove(channel, n)]))

(***************************************************************************)
(* DuplicateNotification(n): n is delivered twice (R33, R34).              *)
(***************************************************************************)
DuplicateNotification(n) ==
    /\ n \in DOMAIN channel
    /\ BagSize(channel) < MaxChannel
    /\ Goto([st EXCEPT !.channel = BagAddAll(channel, {n})])

(***************************************************************************)
(* CrashTm(t): a live TM of the job is lost to the coordinator; it may     *)
(* keep running as a zombie (R57, R64).                                    *)
(***************************************************************************)
CrashTm(t) ==
    /\ running
    /\ t \in CurrentTms(st)
    /\ Goto(Lose(st, t))

(***************************************************************************)
(* CrashDuringWrite(i, c): subtask i's TM crashes in the middle of a       *)
(* write, leaving PartialSize bytes and no handle (R65, R57).              *)
(***************************************************************************)
CrashDuringWrite(i, c) ==
    /\ WriterOk(st, placement[i], i, c, FALSE)
    /\ ~HasOutput(st, placement[i], i, c)
    /\ Goto(DoCrashDuringWrite(st, placement[i], i, c))

(***************************************************************************)
(* ZombieWrite(t, i, c): lost attempt t, not known to have stopped, keeps  *)
(* writing for a subtask it hosted (WriteState with attempt=t; R64).       *)
(***************************************************************************)
ZombieWrite(t, i, c) ==
    /\ WriterOk(st, t, i, c, TRUE)
    /\ ~HasOutput(st, t, i, c)
    /\ Goto(DoWrite(st, t, i, c))

(***************************************************************************)
(* ZombieAck(t, i, c): the zombie acknowledges; the coordinator ignores    *)
(* it (R56), the zombie's own bookkeeping moves on.                        *)
(***************************************************************************)
ZombieAck(t, i, c) ==
    /\ WriterOk(st, t, i, c, TRUE)
    /\ Goto(DoAck(st, t, i, c, TRUE))

(***************************************************************************)
(* AttemptStopped(t): lost attempt t is known to have stopped (R64).       *)
(***************************************************************************)
AttemptStopped(t) ==
    /\ t \in LostTms(st)
    /\ Goto(DoAttemptStopped(st, t))

(***************************************************************************)
(* Failover: restart every subtask from the retained checkpoints, lost     *)
(* TMs replaced by fresh ids (R60-R62); enabled while ids are left.        *)
(***************************************************************************)
Failover ==
    /\ running
    /\ nextTm + Cardinality({t \in PlacedTms(st) : tms[t].status # "alive"}) - 1 <= MaxTm
    /\ Goto(DoFailover(st))

(***************************************************************************)
(* ReplaceTm(t): task-level failover: a fresh TM runs live TM t's          *)
(* subtasks while pending checkpoints stay pending; t is lost (R66).       *)
(***************************************************************************)
ReplaceTm(t) ==
    /\ running
    /\ t \in CurrentTms(st)
    /\ nextTm <= MaxTm
    /\ Goto(DoReplaceTm(st, t))

(***************************************************************************)
(* Restore(c, p, mode): end the job and start a new one from retained      *)
(* checkpoint c with parallelism p, CLAIM or NO_CLAIM (R70-R76).           *)
(***************************************************************************)
Restore(c, p, mode) ==
    /\ job < MaxJob
    /\ \E r \in retained : r.id = c
    /\ nextTm + NumTms - 1 <= MaxTm
    /\ Goto(DoRestore(st, c, p, mode))

(***************************************************************************)
(* Cancel(retain): end the job; retained checkpoints are discarded or      *)
(* given to the user (R90, R91).                                           *)
(***************************************************************************)
Cancel(retain) ==
    /\ running
    /\ Goto(EndJob(st, retain))

(***************************************************************************)
(* Next: any command.  The parts are named so that a model can restrict    *)
(* them and a must-fail model can swap one.                                *)
(***************************************************************************)
CoordinatorNext ==
    \/ Trigger
    \/ \E c \in DOMAIN pending : Complete(c) \/ Abort(c)

SubtaskNext ==
    \E i \in DOMAIN placement, c \in Ckpts :
        \/ WriteState(i, c)
        \/ ReuseShared(i, c)
        \/ Acknowledge(i, c)
        \/ Decline(i, c)

DeliverNext == \E n \in DOMAIN channel : DeliverNotification(n)

LossNext == \E n \in DOMAIN channel : DropNotification(n) \/ DuplicateNotification(n)

CrashNext ==
    \/ \E t \in DOMAIN tms : CrashTm(t) \/ AttemptStopped(t) \/ ReplaceTm(t)
    \/ \E i \in DOMAIN placement, c \in Ckpts : CrashDuringWrite(i, c)
    \/ \E t \in DOMAIN tms, i \in DOMAIN placement, c \in Ckpts :
           ZombieWrite(t, i, c) \/ ZombieAck(t, i, c)
    \/ Failover

JobNext ==
    \/ \E c \in Ckpts, p \in RescalePars, m \in {"CLAIM", "NO_CLAIM"} : Restore(c, p, m)
    \/ \E r \in BOOLEAN : Cancel(r)

Next ==
    \/ CoordinatorNext
    \/ SubtaskNext
    \/ DeliverNext
    \/ LossNext
    \/ CrashNext
    \/ JobNext

(***************************************************************************)
(* Spec.  Safety only: no fairness (I6 is an invariant on quiet states).   *)
(***************************************************************************)
Spec == Init /\ [][Next]_vars

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* TypeOK.                                                                 *)
(***************************************************************************)
Owners(s) == {Coord, User} \cup DOMAIN s.tms
FileIds == ({"data"} \X Nat) \cup ({"meta"} \X Nat)
DirIds == Nat \X Nat \X Nat
EntryKinds == {"seg", "file", "ph", "dir", "none"}

TypeOK ==
    /\ running \in BOOLEAN
    /\ job \in 1..MaxJob
    /\ par \in Nat \ {0}
    /\ placement \in [0..(par - 1) -> DOMAIN tms]
    /\ nextCkpt \in Nat \ {0}
    /\ DOMAIN pending \subseteq 1..(nextCkpt - 1)
    /\ \A c \in DOMAIN pending : /\ DOMAIN pending[c].acks \subseteq DOMAIN placement
                                 /\ pending[c].received \subseteq FileIds
    /\ \A r \in retained : /\ r.id \in 1..(nextCkpt - 1)
                           /\ \A e \in r.entries : e.kind \in {"seg", "file"}
                           /\ r.dirs \subseteq DirIds
    /\ Cardinality(retained) <= NumRetained
    /\ latestCompleted \in Nat /\ watermark \in Nat
    /\ \A k \in DOMAIN registry : registry[k].refs \subseteq Nat /\ registry[k].pins \subseteq Nat
    /\ DOMAIN dirReg \subseteq DirIds
    /\ DOMAIN tms \subseteq 1..(nextTm - 1)
    /\ \A t \in DOMAIN tms : tms[t].status \in {"alive", "lost", "stopped"}
    /\ DOMAIN segs = DOMAIN tms /\ DOMAIN pfiles = DOMAIN tms /\ DOMAIN backend = DOMAIN tms
    /\ \A o \in outputs \cup acked : o.tm \in DOMAIN tms /\ o.e.kind \in EntryKinds
    /\ DOMAIN files \subseteq FileIds
    /\ \A f \in DOMAIN files : files[f].owner \in Owners(st) /\ files[f].open \in BOOLEAN
    /\ DOMAIN dirs \subseteq DirIds
    /\ \A d \in DOMAIN dirs : dirs[d].owner \in Owners(st) /\ dirs[d].usedBy \subseteq Nat
    /\ deleted \subseteq FileIds
    /\ \A n \in DOMAIN channel : n.kind \in {"complete", "abort"} /\ channel[n] \in Nat \ {0}
    /\ nextFile \in Nat /\ nextLid \in Nat /\ nextTm \in Nat
    /\ calm \in 0..(NumRetained + 1)

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* The invariants of spec/invariants.py, over a state record, as the       *)
(* observation (refimpl/observe.py) shows it.                              *)
(***************************************************************************)
Within(s, e) == e.file \in DOMAIN s.files /\ e.off + SegSize <= s.files[e.file].size

(* I1: every handle of every retained checkpoint and of the restoring      *)
(* state points at an existing file and lies within it; metadata and       *)
(* directories exist.                                                      *)
NoDangling(s) ==
    /\ \A r \in s.retained :
          /\ r.meta \in DOMAIN s.files
          /\ \A e \in r.entries : Within(s, e)
          /\ r.dirs \subseteq DOMAIN s.dirs
    /\ \A e \in s.restoring : Within(s, e)

(* I2: no path deleted twice, nothing deleted that did not exist.          *)
NoDoubleDelete(s) ==
    /\ \A b \in s.badDeletes : b.existed
    /\ s.deleted \cap DOMAIN s.files = {}

(* I3: every existing file has exactly one owner, and no live party's      *)
(* bookkeeping claims a file someone else owns.                            *)
Claims(s, f) ==
    LET alive == AliveTms(s)
    IN  {t \in alive : f \in DOMAIN s.pfiles[t]}
          \cup {t \in alive : \E o \in s.outputs : o.tm = t /\ o.e.kind = "file" /\ o.e.file = f}
          \cup (IF /\ s.running
                   /\ \/ \E k \in DOMAIN s.registry : s.registry[k].owned /\ s.registry[k].file = f
                      \/ \E c \in DOMAIN s.pending : f \in s.pending[c].received
                      \/ \E r \in s.retained : r.meta = f
                THEN {Coord} ELSE {})

OneOwner(s) ==
    \A f \in DOMAIN s.files :
        /\ s.files[f].owner \in Owners(s)
        /\ Claims(s, f) \subseteq {s.files[f].owner}

(* I4: a tracked file's ref count equals its live segments; registry       *)
(* references are exactly the retained checkpoints that use each entry.    *)
LiveSegs(s, f) ==
    {<<u, l>> \in UNION {{u2} \X DOMAIN s.segs[u2] : u2 \in AliveTms(s)} : s.segs[u][l].file = f}

SoundCounts(s) ==
    LET alive == AliveTms(s)
        lids == {e.lid : e \in UNION {r.entries : r \in s.retained}}
        want(l) == {r.id : r \in {x \in s.retained : \E e \in x.entries : e.lid = l}}
        have(l) == IF l \in DOMAIN s.registry THEN s.registry[l].refs ELSE {}
        ds == UNION {r.dirs : r \in s.retained}
        wantD(d) == {r.id : r \in {x \in s.retained : d \in x.dirs}}
        haveD(d) == IF d \in DOMAIN s.dirReg THEN s.dirReg[d] ELSE {}
    IN  /\ \A t \in alive : \A f \in DOMAIN s.pfiles[t] :
               s.pfiles[t][f].ref = Cardinality(LiveSegs(s, f))
        /\ \A t \in alive : \A l \in DOMAIN s.segs[t] :
               \E u \in alive : s.segs[t][l].file \in DOMAIN s.pfiles[u]
        /\ \A l \in lids \cup DOMAIN s.registry : have(l) = want(l)
        /\ \A d \in ds \cup DOMAIN s.dirReg : haveD(d) = wantD(d)

(* I5: only the owner deletes, and nothing of the user's is deleted.       *)
NoForeignDelete(s) ==
    \A b \in s.badDeletes : ~b.protected /\ (b.existed => b.owner = b.actor)

(* I6: every file is referenced, open in a live pool or the user's; every  *)
(* managed directory is referenced or held by a live party; no delete      *)
(* waits.                                                                  *)
NoLeak(s) ==
    LET alive == AliveTms(s)
        pool == {f \in UNION {DOMAIN s.pfiles[t] : t \in alive} :
                    \E t \in alive : f \in DOMAIN s.pfiles[t] /\ s.pfiles[t][f].open}
        refDirs == UNION {r.dirs : r \in s.retained}
    IN  /\ \A f \in DOMAIN s.files : Referenced(s, f) \/ f \in pool \/ s.files[f].owner = User
        /\ \A d \in DOMAIN s.dirs :
               d \in refDirs \/ s.dirs[d].owner \in {User, Coord} \cup alive
        /\ s.deferred = {}

Safe(s) == NoDangling(s) /\ NoDoubleDelete(s) /\ OneOwner(s) /\ SoundCounts(s)
             /\ NoForeignDelete(s)

(* Quiet (SPEC §11): lost attempts stopped, no delete waiting, every       *)
(* notification delivered, and, while the job runs, nothing pending and    *)
(* NumRetained + 1 checkpoints completed in a row without faults.          *)
Quiet(s) ==
    /\ Settled(s)
    /\ s.running => (DOMAIN s.pending = {} /\ s.calm = NumRetained + 1)

(***************************************************************************)
(* Quiesce(s): the harness's quiesce() (conformance/harness.py) as an      *)
(* operator: stop every lost attempt, deliver every notification, fail     *)
(* over if a placed TM is not alive, abort what is pending, then           *)
(* NumRetained + 1 fault-free checkpoints (every subtask writes fresh      *)
(* state; the model's one state name is written again, not a new name).    *)
(***************************************************************************)
RECURSIVE DeliverAll(_)
DeliverAll(s) ==
    IF DOMAIN s.channel = {} THEN s
    ELSE DeliverAll(DoDeliver(s, CHOOSE n \in DOMAIN s.channel : TRUE))

FreshCheckpoint(s) ==
    LET c == s.nextCkpt
        s1 == DoTrigger(s)
        s2 == FoldInOrder(LAMBDA x, i : DoAck(DoWrite(x, x.placement[i], i, c),
                                              x.placement[i], i, c, FALSE),
                          s1, DOMAIN s1.placement)
        s3 == IF CanComplete(s2, c) THEN DoComplete(s2, c) ELSE s2
    IN  DeliverAll(s3)

RECURSIVE FreshCheckpoints(_, _)
FreshCheckpoints(s, k) == IF k = 0 THEN s ELSE FreshCheckpoints(FreshCheckpoint(s), k - 1)

Quiesce(s) ==
    LET s1 == DeliverAll(FoldInOrder(DoAttemptStopped, s, LostTms(s)))
        s2 == IF \E t \in PlacedTms(s1) : s1.tms[t].status # "alive"
              THEN DoFailover(s1) ELSE s1
        s3 == AbortAll(s2, DOMAIN s2.pending)
    IN  IF ~s1.running THEN s1 ELSE FreshCheckpoints(s3, NumRetained + 1)

-----------------------------------------------------------------------------------------
(***************************************************************************)
(* I1 No dangling reference.                                               *)
(***************************************************************************)
NoDanglingInv == NoDangling(st)

(***************************************************************************)
(* I2 No double delete.                                                    *)
(***************************************************************************)
NoDoubleDeleteInv == NoDoubleDelete(st)

(***************************************************************************)
(* I3 One owner.                                                           *)
(***************************************************************************)
OneOwnerInv == OneOwner(st)

(***************************************************************************)
(* I4 Sound counts.                                                        *)
(***************************************************************************)
SoundCountsInv == SoundCounts(st)

(***************************************************************************)
(* I5 No foreign delete.                                                   *)
(***************************************************************************)
NoForeignDeleteInv == NoForeignDelete(st)

(***************************************************************************)
(* I6 No leak once quiet, checked in every quiet state reached.            *)
(***************************************************************************)
NoLeakWhenQuietInv == Quiet(st) => NoLeak(st)

(***************************************************************************)
(* I6 as model_tests/explore.py checks it: from every state reached,       *)
(* quiesce a copy and check I1-I6 there (so I6 is checked even where the   *)
(* bounds leave no room for quiet states).                                 *)
(***************************************************************************)
NoLeakAfterQuiesceInv == LET q == Quiesce(st) IN Safe(q) /\ NoLeak(q)

THEOREM Spec => [](TypeOK /\ NoDanglingInv /\ NoDoubleDeleteInv /\ OneOwnerInv
                   /\ SoundCountsInv /\ NoForeignDeleteInv /\ NoLeakWhenQuietInv)
=========================================================================================
