/* The DCP scanner's third part (see _cscan_dcp.c): after the last opcode, state_dict_metadata's items joined as
 * formats/dcp_directory.open_dcp joins them (their planner_data paths, their chunks' storage_data entries) into the
 * direct rows, one per item, that formats/dcp_tree.py makes tensors of with no record in between. Python's dict
 * semantics are kept: a key set twice in planner_data or storage_data has its last value, and items of one name
 * twice make no direct rows at all (the records' path then answers). Keys are hashed in open-addressed tables; a
 * join that probes more than a bound linear in its rows (keys crafted to collide) is given up the same way.
 *
 * torch pickles one str object once and gets it again through the memo, so in a checkpoint saved by one process
 * planner_data's keys and storage_data's FQNs are the items' own strings (same offsets), in the items' order: those
 * are joined by position, with no table. */
#include "_cscan_dcp.h"

/* A key: a string's bytes (text, len) and a tuple of the pool's ints (ints, rank; rank -1: None, -2: none). */
typedef struct {
    int64_t text, len, ints, rank;
} hkey;

typedef struct {
    uint64_t *hashes;
    hkey *keys;
    int64_t *values; /* -1: an empty slot */
    int64_t mask, count, probes, budget;
} hmap;

#define PROBES_PER_ROW 16

static int map_alloc(hmap *m, int64_t cap) {
    m->hashes = malloc((size_t)cap * sizeof *m->hashes);
    m->keys = malloc((size_t)cap * sizeof *m->keys);
    m->values = malloc((size_t)cap * sizeof *m->values);
    m->mask = cap - 1;
    if (!m->hashes || !m->keys || !m->values) return 0;
    memset(m->values, 0xff, (size_t)cap * sizeof *m->values);
    return 1;
}

static void map_free(hmap *m) {
    free(m->hashes);
    free(m->keys);
    free(m->values);
}

/* A table of `rows` keys at first (more make it grow), `ops` lookups and insertions in all. */
static int map_init(hmap *m, int64_t rows, int64_t ops) {
    int64_t cap = 16;
    while (cap < rows * 2) cap *= 2;
    m->count = m->probes = 0;
    m->budget = PROBES_PER_ROW * (ops + 1);
    return map_alloc(m, cap);
}

static uint64_t mix(uint64_t h) {
    h ^= h >> 32;
    h *= UINT64_C(0xd6e8feb86659fd93);
    h ^= h >> 32;
    return h;
}

static uint64_t hash(const scanner *s, hkey k) {
    uint64_t h = (uint64_t)k.len * UINT64_C(0x9e3779b97f4a7c15) ^ (uint64_t)k.rank;
    const uint8_t *p = s->p + k.text;
    int64_t i = 0;
    for (; i + 8 <= k.len; i += 8) {
        uint64_t w;
        memcpy(&w, p + i, 8);
        h = mix(h ^ w);
    }
    uint64_t tail = 0;
    for (; i < k.len; i++) tail = tail << 8 | p[i];
    h = mix(h ^ tail);
    for (int64_t j = 0; j < k.rank; j++) h = mix(h ^ (uint64_t)I64(s->out[CS_DCP_POOL])[k.ints + j]);
    return h;
}

static int same(const scanner *s, hkey a, hkey b) {
    const int64_t *pool = I64(s->out[CS_DCP_POOL]);
    return a.len == b.len && a.rank == b.rank && (a.text == b.text || !memcmp(s->p + a.text, s->p + b.text,
                                                                              (size_t)a.len)) &&
           (a.rank <= 0 || a.ints == b.ints || !memcmp(pool + a.ints, pool + b.ints, (size_t)a.rank * 8));
}

static int grow_map(hmap *m) {
    hmap old = *m;
    if (!map_alloc(m, (old.mask + 1) * 2)) {
        map_free(m);
        *m = old;
        return 0;
    }
    for (int64_t i = 0; i <= old.mask; i++) {
        if (old.values[i] < 0) continue;
        uint64_t j = old.hashes[i] & (uint64_t)m->mask;
        while (m->values[j] >= 0) j = (j + 1) & (uint64_t)m->mask;
        m->hashes[j] = old.hashes[i];
        m->keys[j] = old.keys[i];
        m->values[j] = old.values[i];
    }
    map_free(&old);
    return 1;
}

/* The value slot of k: its value, or -1 where the caller sets it (insert: the key is kept there; else nothing is);
 * NULL past the probe budget or out of memory. */
static int64_t *slot(const scanner *s, hmap *m, hkey k, int insert) {
    static int64_t absent;
    if (insert && m->count * 2 >= m->mask && !grow_map(m)) return NULL;
    uint64_t h = hash(s, k);
    for (uint64_t i = h & (uint64_t)m->mask;; i = (i + 1) & (uint64_t)m->mask) {
        if (m->values[i] < 0) {
            absent = -1;
            if (!insert) return &absent;
            m->hashes[i] = h;
            m->keys[i] = k;
            m->count++;
            return &m->values[i];
        }
        if (m->hashes[i] == h && same(s, m->keys[i], k)) return &m->values[i];
        if (++m->probes > m->budget) return NULL;
    }
}

static hkey text(int64_t at, int64_t len) { return (hkey){at, len, 0, -2}; }

/* The id of a distinct key among `out`'s rows (the key's two fields); -1 past the budget or out of memory. */
static int64_t intern(scanner *s, hmap *m, hkey k, vec *out) {
    int64_t *v = slot(s, m, k, 1);
    if (!v) return -1;
    if (*v < 0) {
        int64_t row[2] = {k.rank == -2 ? k.text : k.ints, k.rank == -2 ? k.len : k.rank};
        if (!put(out, row, 2)) return -1;
        *v = out->len / 2 - 1;
    }
    return *v;
}

typedef struct {
    hmap names, plans, stores, tuples, files, dtypes;
    int64_t *plan_of, *store_of, *file_of; /* per item its planner and storage rows (-1: none), per storage row its
                                              file (-1: a key set again later) */
} joint;

/* A storage_data row's key: its FQN and its offsets (None: rank -1). */
static hkey stored_key(const int64_t *st) {
    return (hkey){st[0], st[1], st[2] < 0 ? 0 : st[2], st[2] < 0 ? -1 : st[3]};
}

/* Each item's planner and storage rows: 1, or 0 (given up: the names are not unique, or too many probes). */
static int match(scanner *s, joint *j, int64_t n_items, int64_t n_planner, int64_t n_storage) {
    const int64_t *items = I64(s->out[CS_DCP_ITEMS]), *planner = I64(s->out[CS_DCP_PLANNER]),
                  *storage = I64(s->out[CS_DCP_STORAGE]), *tensors = I64(s->out[CS_DCP_TENSORS]),
                  *chunks = I64(s->out[CS_DCP_CHUNKS]);
    for (int64_t i = 0; i < n_items; i++) {
        int64_t *v = slot(s, &j->names, text(items[3 * i], items[3 * i + 1]), 1);
        if (!v || *v >= 0) return 0;
        *v = i;
    }
    /* Unique names: planner keys at the items' offsets are unique too, and are each item's key. */
    int64_t by_position = n_planner == n_items;
    for (int64_t i = 0; by_position && i < n_items; i++)
        by_position = planner[4 * i] == items[3 * i] && planner[4 * i + 1] == items[3 * i + 1];
    for (int64_t i = 0; i < n_items; i++) j->plan_of[i] = by_position ? i : -1;
    for (int64_t r = 0; !by_position && r < n_planner; r++) {
        int64_t *v = slot(s, &j->plans, text(planner[4 * r], planner[4 * r + 1]), 1);
        if (!v) return 0;
        *v = r;
    }
    for (int64_t i = 0; !by_position && i < n_items; i++) {
        int64_t *v = slot(s, &j->plans, text(items[3 * i], items[3 * i + 1]), 0);
        if (!v) return 0;
        j->plan_of[i] = *v;
    }
    /* Storage keys of the items' FQNs one by one: unique (the names are), each the key of its item's chunk when
     * the chunk's offsets are its offsets. */
    by_position = n_storage == n_items;
    for (int64_t i = 0; by_position && i < n_items; i++)
        by_position = storage[8 * i] == items[3 * i] && storage[8 * i + 1] == items[3 * i + 1];
    for (int64_t r = 0; r < n_storage; r++) j->file_of[r] = 0;
    for (int64_t r = 0; !by_position && r < n_storage; r++) {
        int64_t *v = slot(s, &j->stores, stored_key(storage + 8 * r), 1);
        if (!v) return 0;
        if (*v >= 0) j->file_of[*v] = -1;
        *v = r;
    }
    for (int64_t i = 0; i < n_items; i++) {
        j->store_of[i] = -1;
        const int64_t *t = items[3 * i + 2] >= 0 ? tensors + 7 * items[3 * i + 2] : NULL;
        const int64_t *c = t && t[6] == 1 ? chunks + 4 * t[5] : NULL;
        if (!c) continue;
        hkey k = {items[3 * i], items[3 * i + 1], c[0], c[1]};
        if (by_position) {
            if (same(s, stored_key(storage + 8 * i), k)) j->store_of[i] = i;
        } else {
            int64_t *v = slot(s, &j->stores, k, 0);
            if (!v) return 0;
            j->store_of[i] = *v;
        }
    }
    return 1;
}

/* The direct rows (see _cscan.h): 1 when made, 0 when given up (memory running out in a table too), -1 when
 * memory ran out for the rows. */
static int join(scanner *s, joint *j) {
    const int64_t *items = I64(s->out[CS_DCP_ITEMS]), *tensors = I64(s->out[CS_DCP_TENSORS]),
                  *chunks = I64(s->out[CS_DCP_CHUNKS]), *planner = I64(s->out[CS_DCP_PLANNER]),
                  *paths = I64(s->out[CS_DCP_PATHS]), *storage = I64(s->out[CS_DCP_STORAGE]),
                  *pool = I64(s->out[CS_DCP_POOL]);
    int64_t n_items = s->out[CS_DCP_ITEMS].len / 3, n_storage = s->out[CS_DCP_STORAGE].len / 8;
    if (!match(s, j, n_items, s->out[CS_DCP_PLANNER].len / 4, n_storage)) return 0;
    /* the files of the entries kept (a key's last): open_dcp counts them */
    int64_t last_at = -1, last_len = 0, last_file = -1;
    for (int64_t r = 0; r < n_storage; r++) {
        if (j->file_of[r] < 0) continue;
        if (storage[8 * r + 4] != last_at || storage[8 * r + 5] != last_len)
            last_file = intern(s, &j->files, text(storage[8 * r + 4], storage[8 * r + 5]), &s->out[CS_DCP_FILES]);
        if (last_file < 0) return 0;
        last_at = storage[8 * r + 4], last_len = storage[8 * r + 5];
        j->file_of[r] = last_file;
    }
    for (int64_t i = 0; i < n_items; i++) {
        int64_t row[CS_DCP_DIRECT_FIELDS] = {items[3 * i], items[3 * i + 1], -1, 0, 0, 0, 0, 0, 0, 0, 0};
        const int64_t *t = items[3 * i + 2] >= 0 ? tensors + 7 * items[3 * i + 2] : NULL;
        /* every tensor's dtype among the names, for dcp_columns' check of them */
        int64_t dtype = t ? intern(s, &j->dtypes, text(t[0], t[1]), &s->out[CS_DCP_DTYPES]) : 0;
        if (dtype < 0) return 0;
        const int64_t *c = j->store_of[i] >= 0 ? chunks + 4 * t[5] : NULL, *plan = NULL;
        if (j->plan_of[i] >= 0) {
            plan = planner + 4 * j->plan_of[i];
            if (plan[3] != 1 || paths[3 * plan[2]] != 0) c = NULL; /* a path of more than one key, or an int */
        }
        /* one chunk of the tensor's size (of its rank: _cscan_dcp_objects.c checked), in storage_data */
        if (c && (!t[4] || c[2] == t[3] || !memcmp(pool + c[2], pool + t[3], (size_t)t[4] * sizeof(int64_t)))) {
            const int64_t *st = storage + 8 * j->store_of[i], *key = plan ? paths + 3 * plan[2] + 1 : items + 3 * i;
            int64_t shape = intern(s, &j->tuples, (hkey){0, 0, t[3], t[4]}, &s->out[CS_DCP_SHAPES]),
                    offsets = intern(s, &j->tuples, (hkey){0, 0, c[0], c[1]}, &s->out[CS_DCP_SHAPES]);
            if (shape < 0 || offsets < 0) return 0;
            int64_t made[] = {key[0], key[1], dtype, t[2], shape, offsets, j->file_of[j->store_of[i]], st[6], st[7]};
            memcpy(row + 2, made, sizeof made);
        }
        if (!put(&s->out[CS_DCP_DIRECT], row, CS_DCP_DIRECT_FIELDS)) return -1;
    }
    return 1;
}

/* The direct rows and their tables, and whether they were made (the header's last field); 0 when memory ran out. */
int dcp_join(scanner *s) {
    int64_t n_items = s->out[CS_DCP_ITEMS].len / 3, n_planner = s->out[CS_DCP_PLANNER].len / 4,
            n_storage = s->out[CS_DCP_STORAGE].len / 8;
    joint j;
    memset(&j, 0, sizeof j);
    size_t per_item = (size_t)(n_items ? n_items : 1) * sizeof(int64_t);
    j.plan_of = malloc(per_item);
    j.store_of = malloc(per_item);
    j.file_of = malloc((size_t)(n_storage ? n_storage : 1) * sizeof(int64_t));
    int made = -1;
    if (j.plan_of && j.store_of && j.file_of && map_init(&j.names, n_items, n_items) &&
        map_init(&j.plans, 0, n_planner + n_items) && map_init(&j.stores, 0, n_storage + n_items) &&
        map_init(&j.tuples, 0, 2 * n_items) && map_init(&j.files, 0, n_storage) && map_init(&j.dtypes, 0, n_items))
        made = join(s, &j);
    hmap *maps[] = {&j.names, &j.plans, &j.stores, &j.tuples, &j.files, &j.dtypes};
    for (int i = 0; i < 6; i++) map_free(maps[i]);
    free(j.plan_of);
    free(j.store_of);
    free(j.file_of);
    if (made != 1)
        s->out[CS_DCP_DIRECT].len = s->out[CS_DCP_SHAPES].len = s->out[CS_DCP_FILES].len =
            s->out[CS_DCP_DTYPES].len = 0;
    I64(s->out[CS_DCP_HEADER])[3] = made == 1;
    return made >= 0;
}
