/* SPDX-License-Identifier: MIT */
/*
 * test_hitpath.c - the lock-free hit (docs/recovery.md, "Lock-free
 * hits"): a Ready hit and its release take no bucket lock and write no line
 * another process writes (the lease is an entry of the slot's hit line in
 * the hitter's own table), and crash recovery stays exact.
 *
 * Key idea: a death at each step of the lock-free hit and release, and of
 * the counted leases' take and drop (marked in transit around their count
 * changes), is made exact with a test point that SIGKILLs a real attached
 * child there. After the server reaps it, the leases on the slot must be
 * exactly the live ones (ours: one hit lease, no count), the key must be
 * served again, the slot must be open to lock-free hits again, and it must
 * be evictable exactly when our lease goes (no leaked lease, no lost one).
 * Then every closer against a hit lease held in another process, the race
 * the hit's check exists for (the slot evicted and reloaded with another
 * key between the walk and the claim), and a stress of hitters against
 * evictors, removers, writers and random kills, checking every byte a
 * lease shows.
 */
#include "cache_i.h"
#include "slot_i.h"
#include "testpoint_i.h"
#include "testutil.h"

#include <criterion/criterion.h>
#include <criterion/parameterized.h>
#include <errno.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#define SHARD 4096u
#define MS    (1000 * 1000ll)
#define SEC   (1000 * MS)

struct shm {
    char path[128];
    _Atomic uint32_t step;
    _Atomic int stop;
    struct sfs_key key;
    char point[32];     /* the step to die at */
    int mode;           /* enum kill_mode */
    _Atomic uint64_t hits, checked, bad;
};

static struct shm *sh;

static void shm_new(const char *tag)
{
    sh = mmap(NULL, sizeof(*sh), PROT_READ | PROT_WRITE, MAP_SHARED | MAP_ANONYMOUS, -1, 0);
    cr_assert(sh != MAP_FAILED);
    memset(sh, 0, sizeof(*sh));
    snprintf(sh->path, sizeof(sh->path), "%s", tu_path(tag));
}

static struct sfs_cache *served(uint32_t nslots, const char *tag)
{
    struct sfs_cache *c = tu_cache(nslots, 0, SHARD);

    cr_assert(c);
    shm_new(tag);
    cr_assert_eq(sfs_cache_serve(c, sh->path), 0);
    return c;
}

static void tp_nothing(const char *name, void *arg)
{
    (void)name;
    (void)arg;
}

/* Entries on slot s in every record's table: held ones, and in transit. */
static void entries_on(struct sfs_cache *c, uint32_t s, unsigned *held, unsigned *transit)
{
    *held = *transit = 0;
    for (uint32_t p = 0; p < c->max_procs; p++) {
        _Atomic uint32_t *t = lease_table(c, p);

        for (uint32_t e = 0; e < c->max_leases; e++) {
            uint32_t v = atomic_load(&t[e]);

            if (v != SFS_ENTRY_FREE && ENTRY_SLOT1(v) == s + 1) {
                if (v & ENTRY_TRANSIT)
                    (*transit)++;
                else
                    (*held)++;
            }
        }
    }
}

/* Get k, expect a hit with the right bytes, release. */
static void assert_hit(struct sfs_cache *c, const struct sfs_key *k)
{
    struct sfs_lease l;

    cr_assert_eq(sfs_cache_get(c, k, 0, sfs_deadline_after(SEC), &l), SFS_HIT);
    cr_assert_eq(sfs_cache_length(c, &l), SHARD);
    cr_assert_eq(tu_check(k, sfs_cache_data(c, &l), SHARD), -1);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
}

/* ---------------------------------------------------------------------------
 * A death at every new step.
 */

enum kill_mode {
    KILL_IN_GET,          /* the point is on the Get of a Ready key */
    KILL_IN_RELEASE,      /* the point is on the Release of a hit's lease */
    KILL_IN_LOCKED_GET,   /* the same, with the locked path forced */
    KILL_IN_LOCKED_RELEASE,
    KILL_IN_COUNTED_RELEASE, /* a locked Get's counted lease, released lock-free */
};

/* One death: the point, where it is, and the requests the dead child's Get
 * must leave counted once its record is reaped (0: it died before its hit
 * was counted; a hit counts on its entry's hit counter, which the reap
 * folds into the retired totals). */
struct kill_case {
    char point[32]; /* a copy, not a pointer: Criterion runs each case apart */
    enum kill_mode mode;
    int requests;
};

static const struct kill_case kill_cases[] = {
    {"hit:walked", KILL_IN_GET, 0},
    {"hit:claimed", KILL_IN_GET, 0},
    {"hit:checked", KILL_IN_GET, 0},
    {"hit:tallied", KILL_IN_GET, 1},
    {"release:hit_freed", KILL_IN_RELEASE, 1},
    {"release:intent", KILL_IN_COUNTED_RELEASE, 1},
    {"release:dropped", KILL_IN_COUNTED_RELEASE, 1},
    {"take:transit", KILL_IN_LOCKED_GET, 1},
    {"take:counted", KILL_IN_LOCKED_GET, 1},
    {"release:transit_locked", KILL_IN_LOCKED_RELEASE, 1},
};

static int die_at_point(struct sfs_cache *c, void *arg)
{
    struct sfs_lease l;

    (void)arg;
    /* Every mode but the hit's own takes a counted lease (the locked Get). */
    if (sh->mode != KILL_IN_GET && sh->mode != KILL_IN_RELEASE)
        sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL);
    if (sh->mode == KILL_IN_GET || sh->mode == KILL_IN_LOCKED_GET)
        sfs_testpoint_arm(sh->point, SFS_TP_KILL, NULL, NULL);
    TU_CK(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l) == SFS_HIT);
    if (sh->mode == KILL_IN_COUNTED_RELEASE)
        sfs_testpoint_disarm_all(); /* the release goes lock-free */
    if (sh->mode == KILL_IN_LOCKED_RELEASE)
        sfs_testpoint_arm("release:locked", SFS_TP_CALL, tp_nothing, NULL);
    sfs_testpoint_arm(sh->point, SFS_TP_KILL, NULL, NULL);
    sfs_cache_release(c, &l);
    return 2; /* the point was never reached */
}

static void kill_at(const struct kill_case *kc)
{
    struct sfs_cache *c = served(8, "hp-kill.sock");
    const char *point = kc->point;
    struct sfs_lease mine;
    struct sfs_stats st0, st;
    unsigned held, transit;

    sh->key = tu_key(41, 0);
    snprintf(sh->point, sizeof(sh->point), "%s", point);
    sh->mode = kc->mode;
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, 0, &mine), SFS_HIT);
    uint32_t s = mine.slot;
    sfs_cache_stats(c, &st0);
    int64_t retired0 = c->hdr->retired[CTR_REQUESTS];

    pid_t p = tu_fork_attached(sh->path, 1, die_at_point, NULL);
    cr_assert_eq(tu_wait_for(p, 10 * SEC), 128 + SIGKILL, "the child did not die at %s", point);
    tu_wait_reaped(c, 1);

    /* Exact: our lease (a hit's, in no count) and nothing else, nothing
     * left in transit. */
    entries_on(c, s, &held, &transit);
    cr_assert_eq(held, 1, "%s: %u held entries", point, held);
    cr_assert_eq(transit, 0, "%s: %u entries left in transit", point, transit);
    cr_assert_eq(sfs_slot_refs(&c->slots[s]), 0, "%s: count %u, no counted lease", point,
                 sfs_slot_refs(&c->slots[s]));
    cr_assert_eq(tu_leases_on(c, s), 1, "%s: %u leases, not 1", point, tu_leases_on(c, s));
    /* Its request counted once, and folded into the retired totals. */
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.requests, st0.requests + (uint64_t)kc->requests, "%s: %llu requests, not %llu",
                 point, (unsigned long long)st.requests,
                 (unsigned long long)(st0.requests + (uint64_t)kc->requests));
    cr_assert_eq(c->hdr->retired[CTR_REQUESTS], retired0 + kc->requests,
                 "%s: the reap folded %lld requests, not %d", point,
                 (long long)(c->hdr->retired[CTR_REQUESTS] - retired0), kc->requests);
    /* Served again, and open to lock-free hits again. */
    assert_hit(c, &sh->key);
    cr_assert(atomic_load(&c->slots[s].refcount) & SLOT_REF_OPEN, "%s: slot left closed", point);
    /* Not lost: our lease pins it. Not leaked: without it, it goes. */
    cr_assert_eq(sfs_cache_remove(c, &sh->key), -EBUSY, "%s: removed under a lease", point);
    cr_assert_eq(sfs_cache_release(c, &mine), 0);
    cr_assert_eq(tu_leases_on(c, s), 0);
    cr_assert_eq(sfs_cache_remove(c, &sh->key), 0, "%s: a leaked count pins the slot", point);
    unsigned ent;
    cr_assert_eq(tu_leases_left(c, &ent), 0);
    cr_assert_eq(ent, 0);
    sfs_cache_close(c);
}

ParameterizedTestParameters(hitpath, killed_at_each_step)
{
    return cr_make_param_array(struct kill_case, (struct kill_case *)kill_cases,
                               sizeof(kill_cases) / sizeof(kill_cases[0]));
}

/* One case per step of the hit, the release and the locked take and drop. */
ParameterizedTest(const struct kill_case *kc, hitpath, killed_at_each_step, .timeout = 30)
{
    kill_at(kc);
}

/* ---------------------------------------------------------------------------
 * A recount never runs while a live process is between two steps on the
 * slot: a dead process's transit entry is settled only once a live
 * releaser stopped right after its intent (its entry in transit, its count
 * not yet dropped) has moved on. Recounting at once would count the live
 * lease as gone, and its decrement would then take another's.
 */

static int stop_in_release_then_hold(struct sfs_cache *c, void *arg)
{
    struct sfs_lease l;

    (void)arg;
    /* A counted lease (the locked Get's), released lock-free. */
    sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL);
    TU_CK(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l) == SFS_HIT);
    sfs_testpoint_disarm_all();
    TU_CK(tu_check(&sh->key, sfs_cache_data(c, &l), SHARD) == -1);
    sfs_testpoint_arm("release:intent", SFS_TP_STOP, NULL, NULL);
    TU_CK(sfs_cache_release(c, &l) == 0);
    sfs_testpoint_disarm_all();
    atomic_store(&sh->step, 1);
    while (!atomic_load(&sh->stop))
        usleep(1000);
    return 0;
}

static int die_in_counted_release(struct sfs_cache *c, void *arg)
{
    struct sfs_lease l;

    (void)arg;
    sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL);
    TU_CK(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l) == SFS_HIT);
    sfs_testpoint_disarm_all();
    sfs_testpoint_arm("release:intent", SFS_TP_KILL, NULL, NULL);
    sfs_cache_release(c, &l);
    return 2;
}

static pid_t stopped_pid;

/* A failed assertion must not leave the stopped child holding our stderr. */
static void kill_stopped(void)
{
    if (stopped_pid > 0)
        kill(stopped_pid, SIGKILL);
    stopped_pid = 0;
}

/* Until the server has declared a record dead or reaped one (3 s). */
static void wait_dead_or_reaped(struct sfs_cache *c)
{
    struct sfs_stats st;

    for (int i = 0; i < 3000; i++) {
        sfs_cache_stats(c, &st);
        if (st.reaped)
            return;
        for (uint32_t p = 0; p < c->max_procs; p++)
            if (atomic_load(&c->procs[p].state) == PROC_DEAD)
                return;
        usleep(1000);
    }
    cr_assert_fail("the dead child's record was never declared dead");
}

Test(hitpath, recount_waits_for_a_live_releaser_mid_step, .timeout = 30, .fini = kill_stopped)
{
    struct sfs_cache *c = served(8, "hp-live.sock");
    struct sfs_lease mine;
    struct sfs_stats st;
    int status;

    sh->key = tu_key(43, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, 0, &mine), SFS_HIT); /* a hit's lease */
    uint32_t s = mine.slot;

    pid_t a = tu_fork_attached(sh->path, 1, stop_in_release_then_hold, NULL);
    stopped_pid = a;
    cr_assert_eq(waitpid(a, &status, WUNTRACED), a);
    cr_assert(WIFSTOPPED(status), "the releaser did not stop after its intent");
    cr_assert_eq(sfs_slot_refs(&c->slots[s]), 1, "the stopped releaser's count");

    pid_t b = tu_fork_attached(sh->path, 1, die_in_counted_release, NULL);
    cr_assert_eq(tu_wait_for(b, 10 * SEC), 128 + SIGKILL);
    wait_dead_or_reaped(c);
    usleep(600 * 1000); /* the server's reaper tries, and retries within 200 ms */
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.reaped, 0, "the dead intent was settled while a live releaser was mid-step");
    cr_assert_eq(sfs_slot_refs(&c->slots[s]), 2, "count %u", sfs_slot_refs(&c->slots[s]));

    kill(a, SIGCONT);
    for (int i = 0; i < 3000 && atomic_load(&sh->step) < 1; i++)
        usleep(1000);
    cr_assert_eq(atomic_load(&sh->step), 1);
    tu_wait_reaped(c, 1);
    cr_assert_eq(sfs_slot_refs(&c->slots[s]), 0, "both counted leases are gone");
    cr_assert_eq(tu_leases_on(c, s), 1, "ours");
    atomic_store(&sh->stop, 1);
    cr_assert_eq(tu_wait_for(a, 10 * SEC), 0);
    stopped_pid = 0;
    cr_assert_eq(sfs_cache_remove(c, &sh->key), -EBUSY);
    cr_assert_eq(sfs_cache_release(c, &mine), 0);
    cr_assert_eq(sfs_cache_remove(c, &sh->key), 0);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A hit lease is in no count: every closer must find it in the hit lines.
 * Another process holds one on A (its slot's count reads 0); an evict, a
 * remove and a write must each leave A alone, and the holder's bytes stay
 * A's. Without the closers' read of the hit lines each of them takes A.
 */

static int hold_a_hit(struct sfs_cache *c, void *arg)
{
    struct sfs_lease l;

    (void)arg;
    TU_CK(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l) == SFS_HIT);
    TU_CK(entry_is_hit(c, l.entry));
    atomic_store(&sh->step, 1);
    while (!atomic_load(&sh->stop))
        usleep(1000);
    TU_CK(key_eq_atomic(&c->slots[l.slot], &sh->key));
    TU_CK(tu_check(&sh->key, sfs_cache_data(c, &l), SHARD) == -1);
    TU_CK(sfs_cache_release(c, &l) == 0);
    return 0;
}

Test(hitpath, a_hit_lease_keeps_its_slot_from_every_closer, .timeout = 30, .fini = kill_stopped)
{
    struct sfs_cache *c = served(2, "hp-closers.sock");
    const struct sfs_key b = tu_key(52, 0), x = tu_key(53, 0), y = tu_key(54, 0);
    struct sfs_lease l;

    sh->key = tu_key(51, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    cr_assert_eq(tu_load(c, &b), SFS_OWNER);
    uint32_t s = SFS_NIL;
    for (uint32_t i = 0; i < c->nslots; i++)
        if (key_eq_atomic(&c->slots[i], &sh->key))
            s = i;
    cr_assert_neq(s, SFS_NIL);

    pid_t p = tu_fork_attached(sh->path, 1, hold_a_hit, NULL);
    stopped_pid = p; /* a failed assertion must not leave it waiting */
    for (int i = 0; i < 5000 && atomic_load(&sh->step) < 1; i++)
        usleep(1000);
    cr_assert_eq(atomic_load(&sh->step), 1, "the holder did not take its hit");
    cr_assert_eq(sfs_slot_refs(&c->slots[s]), 0, "a hit lease is in no count");
    cr_assert_eq(tu_leases_on(c, s), 1);

    cr_assert_eq(sfs_cache_remove(c, &sh->key), -EBUSY, "removed under a hit lease");
    cr_assert_eq(sfs_cache_get(c, &sh->key, SFS_GET_WRITE, 0, &l), -EBUSY,
                 "rewritten under a hit lease");
    /* Two slots: each load must evict the other one, never A. */
    cr_assert_eq(tu_load(c, &x), SFS_OWNER);
    cr_assert_eq(tu_load(c, &y), SFS_OWNER);
    cr_assert(key_eq_atomic(&c->slots[s], &sh->key), "A's slot was evicted under a hit lease");
    cr_assert_eq(sfs_cache_state(c, &sh->key), SFS_STATE_READY);
    cr_assert(atomic_load(&c->slots[s].refcount) & SLOT_REF_OPEN, "a failed close left A closed");

    atomic_store(&sh->stop, 1);
    cr_assert_eq(tu_wait_for(p, 10 * SEC), 0, "the holder saw its slot change");
    stopped_pid = 0;
    cr_assert_eq(sfs_cache_remove(c, &sh->key), 0, "released, A goes");
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * The last check of a hit: between its walk and its claim, the slot is
 * removed and reloaded with another key, and is open again (the claim
 * succeeds, the word reads open: ABA). The hit must let it go, not return
 * the other key's bytes.
 */

static struct sfs_cache *aba_cache;
static struct sfs_key aba_other;

static void reload_other(const char *name, void *arg)
{
    (void)arg;
    sfs_testpoint_arm(name, SFS_TP_OFF, NULL, NULL);
    cr_assert_eq(sfs_cache_remove(aba_cache, &sh->key), 0);
    cr_assert_eq(tu_load(aba_cache, &aba_other), SFS_OWNER);
}

Test(hitpath, slot_reused_between_walk_and_cas, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(1, 0, SHARD); /* one slot: B reuses A's */
    struct sfs_lease l;

    cr_assert(c);
    shm_new("hp-aba");
    aba_cache = c;
    sh->key = tu_key(1, 0);
    aba_other = tu_key(2, 0);
    cr_assert_eq(tu_load(c, &sh->key), SFS_OWNER);
    uint32_t s = 0;
    uint32_t w0 = atomic_load(&c->slots[s].refcount);
    cr_assert_eq(w0, SLOT_REF_OPEN, "A is Ready, open, unleased");

    cr_assert_eq(sfs_testpoint_arm("hit:walked", SFS_TP_CALL, reload_other, NULL), 0);
    int role = sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l);
    cr_assert_eq(sfs_testpoint_hits("hit:walked"), 0); /* disarmed by the callback */
    cr_assert_eq(role, SFS_OWNER, "a hit on A's slot, now holding B (role %d)", role);
    cr_assert_eq(tu_publish(c, &sh->key, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    assert_hit(c, &sh->key);
    cr_assert_eq(sfs_cache_state(c, &aba_other), -ENOENT);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A prefetched load's first use counts one prefetch hit, even when a
 * lock-free hit and a locked Get race on the slot: the locked Get has read
 * the flag and, before it clears it, a lock-free hit clears and counts it.
 * The locked Get then must not count it again (it did, before both paths
 * marked a use through one helper).
 */

static struct sfs_cache *pf_cache;
static struct sfs_lease pf_inner;
static int pf_inner_role;

static void hit_lock_free(const char *name, void *arg)
{
    (void)name;
    (void)arg;
    /* This thread holds the key's bucket lock: a locked Get would wait on
     * it; the lock-free hit never takes it. */
    atomic_store(&sfs_testpoints_force_locked, 0);
    pf_inner_role = sfs_cache_get(pf_cache, &sh->key, 0, sfs_deadline_after(SEC), &pf_inner);
    atomic_store(&sfs_testpoints_force_locked, 1);
}

Test(hitpath, a_prefetch_hit_counts_once_when_both_paths_race, .timeout = 30)
{
    struct sfs_cache *c = tu_cache(4, 0, SHARD);
    struct sfs_lease l;
    struct sfs_stats st;

    cr_assert(c);
    shm_new("hp-pf");
    pf_cache = c;
    sh->key = tu_key(7, 0);
    cr_assert_eq(sfs_cache_get(c, &sh->key, SFS_GET_PREFETCH, 0, &l), SFS_OWNER);
    cr_assert_eq(tu_publish(c, &sh->key, &l), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);

    cr_assert_eq(sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL), 0);
    cr_assert_eq(sfs_testpoint_arm("get:prefetch_seen", SFS_TP_CALL, hit_lock_free, NULL), 0);
    cr_assert_eq(sfs_cache_get(c, &sh->key, 0, sfs_deadline_after(SEC), &l), SFS_HIT);
    sfs_testpoint_disarm_all();
    cr_assert_eq(pf_inner_role, SFS_HIT, "the lock-free hit inside the window: %d", pf_inner_role);
    cr_assert_eq(sfs_cache_release(c, &pf_inner), 0);
    cr_assert_eq(sfs_cache_release(c, &l), 0);
    sfs_cache_stats(c, &st);
    cr_assert_eq(st.prefetch_hits, 1, "one prefetched load, %lu prefetch hits",
                 (unsigned long)st.prefetch_hits);
    cr_assert_eq(st.hits, 2);
    cr_assert_eq(tu_leases_left(c, NULL), 0);
    sfs_cache_close(c);
}

/* ---------------------------------------------------------------------------
 * A thread's spare lease entry follows the handle it uses. Its spare was of
 * a handle it no longer uses (one it used before a re-attach, or its
 * parent's across a fork): every Get then popped an entry off the stack and
 * every Release pushed it back, two CAS more on each hit, for good.
 */

Test(hitpath, spare_follows_the_handle_a_thread_uses, .timeout = 30)
{
    struct sfs_cache *a = tu_cache(8, 0, SHARD), *b = tu_cache(8, 0, SHARD);
    const struct sfs_key k = tu_key(7, 0);

    cr_assert(a && b);
    cr_assert_eq(tu_load(a, &k), SFS_OWNER);
    cr_assert_eq(tu_load(b, &k), SFS_OWNER);
    /* The locked path's Gets (a lock-free hit takes a hit line, no spare). */
    cr_assert_eq(sfs_testpoint_arm("get:locked", SFS_TP_CALL, tp_nothing, NULL), 0);
    assert_hit(a, &k); /* our spare is a's entry now */
    cr_assert_eq(sfs_testpoint_arm("lease:pop", SFS_TP_CALL, tp_nothing, NULL), 0);
    for (int i = 0; i < 1000; i++)
        assert_hit(b, &k);
    unsigned pops = sfs_testpoint_hits("lease:pop");
    sfs_testpoint_disarm_all();
    cr_assert_leq(pops, SPARE_SWITCH, "%u of 1000 Gets on b popped an entry", pops);
    /* a got its entry back: nothing leaked, both close clean. */
    assert_hit(a, &k);
    cr_assert_eq(tu_leases_left(a, NULL), 0);
    cr_assert_eq(tu_leases_left(b, NULL), 0);
    sfs_cache_close(b);
    sfs_cache_close(a);
}

/* ---------------------------------------------------------------------------
 * Stress: hitters against evictors (loads of other keys into a full cache),
 * removers and writers (SFS_GET_WRITE), in real processes; every lease's
 * bytes are checked, and so is the key of the slot a hit leases (no slot is
 * evicted or rewritten under a lease). Then hitters are killed at random
 * instants, and after the reaps nothing is left leased.
 */

#define NKEYS 24

static struct sfs_key skey(uint64_t i)
{
    return tu_key(1000 + i, (uint32_t)(i % 3));
}

/* Role: 0 hitter, 1 loader (evicts), 2 remover, 3 writer. */
static int stress_body(struct sfs_cache *c, void *arg)
{
    int role = (int)(intptr_t)arg;
    uint64_t rng = 0x9e3779b97f4a7c15ull ^ (uint64_t)getpid() << 16;
    struct sfs_lease l;

    atomic_fetch_add(&sh->step, 1);
    while (!atomic_load(&sh->stop)) {
        uint64_t i = tu_rng_next(&rng) % NKEYS;
        struct sfs_key k = skey(role == 0 ? i % 8 : i); /* hitters: the hot 8 */
        int r;

        switch (role) {
        case 2:
            r = sfs_cache_remove(c, &k);
            TU_CK(r == 0 || r == -EBUSY || r == -ENOENT);
            continue;
        case 3:
            r = sfs_cache_get(c, &k, SFS_GET_WRITE, sfs_deadline_after(SEC), &l);
            if (r == -EBUSY)
                continue;
            TU_CK(r == SFS_OWNER);
            TU_CK(tu_publish(c, &k, &l) == 0);
            TU_CK(sfs_cache_release(c, &l) == 0);
            continue;
        default:
            break;
        }
        r = sfs_cache_get(c, &k, 0, sfs_deadline_after(5 * SEC), &l);
        TU_CK(r >= 0);
        if (r == SFS_OWNER) {
            TU_CK(tu_publish(c, &k, &l) == 0);
        } else if (r == SFS_WAITER) {
            int w = sfs_cache_wait(c, &l, sfs_deadline_after(5 * SEC));

            TU_CK(w >= 0);
            if (w == SFS_WAIT_OWNER)
                TU_CK(tu_publish(c, &k, &l) == 0);
            else if (w != SFS_WAIT_READY)
                goto release; /* failed: nothing to check */
        } else {
            atomic_fetch_add(&sh->hits, 1);
        }
        /* While we lease it, the slot carries our key and our bytes. */
        const struct sfs_slot_rec *sl = &c->slots[l.slot];
        if (!key_eq_atomic(sl, &k) ||
            atomic_load(&sl->state) != SFS_STATE_READY ||
            tu_check(&k, sfs_cache_data(c, &l), SHARD) != -1)
            atomic_fetch_add(&sh->bad, 1);
        atomic_fetch_add(&sh->checked, 1);
    release:
        TU_CK(sfs_cache_release(c, &l) == 0);
    }
    return 0;
}

static pid_t spawn(int role)
{
    return tu_fork_attached(sh->path, 1, stress_body, (void *)(intptr_t)role);
}

Test(hitpath, stress_hitters_evictors_removers_writers, .timeout = 120)
{
    /* 8 slots for 24 keys: loads evict all the time. */
    struct sfs_cache *c = served(8, "hp-stress.sock");
    const int roles[] = {0, 0, 0, 1, 2, 3};
    const int n = sizeof(roles) / sizeof(roles[0]);
    pid_t p[8];
    uint64_t rng = 12345;
    int reaped = 0;

    for (int i = 0; i < n; i++)
        p[i] = spawn(roles[i]);
    while (atomic_load(&sh->step) < (uint32_t)n)
        usleep(1000);
    /* Kill a hitter at a random instant now and then, and start another. */
    for (int round = 0; round < 6; round++) {
        usleep(150000 + tu_rng_next(&rng) % 150000);
        int v = (int)(tu_rng_next(&rng) % 3); /* one of the hitters */
        kill(p[v], SIGKILL);
        cr_assert_eq(tu_wait(p[v]), 128 + SIGKILL);
        reaped++;
        /* Attached before it can be the next one killed: a child killed
         * before the server claimed its record leaves nothing to reap. */
        uint32_t started = atomic_load(&sh->step);
        p[v] = spawn(0);
        for (int i = 0; i < 10000 && atomic_load(&sh->step) == started; i++)
            usleep(1000);
        cr_assert_neq(atomic_load(&sh->step), started, "a new hitter did not start");
    }
    usleep(300000);
    atomic_store(&sh->stop, 1);
    for (int i = 0; i < n; i++)
        cr_assert_eq(tu_wait_for(p[i], 20 * SEC), 0, "stress child %d (role %d)", i, roles[i]);
    tu_wait_reaped(c, (uint64_t)reaped);
    fprintf(stderr, "hitpath stress: %llu leases checked, %llu hits, %llu bad\n",
            (unsigned long long)atomic_load(&sh->checked),
            (unsigned long long)atomic_load(&sh->hits), (unsigned long long)atomic_load(&sh->bad));
    cr_assert_eq(atomic_load(&sh->bad), 0, "a lease showed another key or wrong bytes");
    cr_assert_gt(atomic_load(&sh->hits), 0);
    /* Every death reaped: no count and no entry is left, and every slot
     * can be taken again. */
    unsigned ent;
    cr_assert_eq(tu_leases_left(c, &ent), 0, "slots still counted after every lease went");
    cr_assert_eq(ent, 0, "entries left in the tables");
    for (uint64_t i = 0; i < NKEYS; i++) {
        struct sfs_key k = skey(i);
        int r = sfs_cache_remove(c, &k);

        cr_assert(r == 0 || r == -ENOENT, "key %llu: remove %d", (unsigned long long)i, r);
    }
    for (uint64_t i = 0; i < 8; i++) {
        struct sfs_key k = tu_key(5000 + i, 0);

        cr_assert_eq(tu_load(c, &k), SFS_OWNER);
    }
    sfs_cache_close(c);
}
