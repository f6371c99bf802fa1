/* A compiled scanner for the data.pkl of a torch.save zip: a typed stack machine over the opcodes torch writes for
 * a dict of tensors, emitting rows into flat int64 tables instead of Python objects (issue 24's columns).
 *
 * Plain C, no Python.h: loaded with ctypes by ckptfs/pickle/cscan.py. It accepts only what it reproduces exactly:
 * a dict (EMPTY_DICT or OrderedDict()) whose items are str keys and _rebuild_tensor_v2 records with
 * ('storage', torch.<Name>Storage, key, location, numel) persistent ids, and its tensors again through the
 * memo (tied weights); a state_dict()'s _metadata, which the reference drops, is checked and skipped. Anything
 * else, and any input on which the reference interpreter would raise, makes it return CS_REFUSED: the pure-Python
 * interpreter then parses the same bytes and its value or error is the answer.
 * Limits are passed in and it refuses before reaching them, so the reference reports them.
 */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "_cscan.h"

enum kind { V_STR, V_INT, V_BOOL, V_NONE, V_REBUILD, V_ODICT_CLASS, V_STORAGE_CLASS, V_TUPLE, V_PID, V_STORAGE,
            V_DICT, V_ARGS, V_TENSOR };

typedef struct {
    int32_t kind;
    int64_t a, b; /* V_STR: offset, length; V_INT, V_BOOL: value; V_STORAGE_CLASS: name offset, length;
                     V_TUPLE: pool offset, length; V_PID, V_ARGS: row in pids/args; V_STORAGE: storage row;
                     V_TENSOR: tensor row; V_DICT: its number (the root is the first made, 0) */
} value;

typedef struct {
    int64_t *data;
    int64_t len, cap;
} vec;

typedef struct {
    const uint8_t *p;
    int64_t n, pos;
    int64_t max_memo, max_depth;
    value *stack;
    int64_t sp, stack_cap;
    int64_t *frames; /* stack index where each open MARK's frame starts */
    int64_t nframes;
    value *memo;
    int64_t memo_len, memo_cap;
    vec pool, pids, args, storages, tensors, items;
    vec filled; /* by dict number: whether items were set in it */
} scanner;

#define MAX_FRAMES 8
#define MAX_RANK 64
#define LIMIT_62 (INT64_C(1) << 62)

static int grow(void **buf, int64_t *cap, int64_t need, size_t item) {
    if (need <= *cap) return 1;
    int64_t cap2 = *cap ? *cap : 64;
    while (cap2 < need) cap2 *= 2;
    void *grown = realloc(*buf, (size_t)cap2 * item);
    if (!grown) return 0;
    *buf = grown;
    *cap = cap2;
    return 1;
}

static int put_row(vec *v, const int64_t *row, int64_t width) {
    if (!grow((void **)&v->data, &v->cap, v->len + width, sizeof(int64_t))) return 0;
    memcpy(v->data + v->len, row, (size_t)width * sizeof(int64_t));
    v->len += width;
    return 1;
}

static int push(scanner *s, value v) {
    int64_t base = s->nframes ? s->frames[s->nframes - 1] : 0;
    /* The reference refuses a push onto a frame of max_depth entries: stop one short of any limit. */
    if (s->sp - base + 2 >= s->max_depth) return 0;
    if (!grow((void **)&s->stack, &s->stack_cap, s->sp + 1, sizeof(value))) return 0;
    s->stack[s->sp++] = v;
    return 1;
}

static int new_dict(scanner *s) {
    int64_t zero = 0;
    if (!put_row(&s->filled, &zero, 1)) return 0;
    return push(s, (value){V_DICT, s->filled.len - 1, 0});
}

static int64_t frame_base(const scanner *s) { return s->nframes ? s->frames[s->nframes - 1] : 0; }

static int need(const scanner *s, int64_t k) { return s->pos + k <= s->n; }

/* Where an opcode's k-byte argument starts, the position moved past it; -1 when the input ends first. */
static int64_t take(scanner *s, int64_t k) {
    if (!need(s, k)) return -1;
    s->pos += k;
    return s->pos - k;
}

static uint32_t u32(const uint8_t *q) {
    return (uint32_t)q[0] | (uint32_t)q[1] << 8 | (uint32_t)q[2] << 16 | (uint32_t)q[3] << 24;
}

static int memo_put(scanner *s, int64_t index) {
    if (s->sp <= frame_base(s)) return 0;
    /* Puts of the next free slot only (torch's), one short of max_memo_entries. */
    if (index != s->memo_len || s->memo_len + 2 > s->max_memo) return 0;
    if (!grow((void **)&s->memo, &s->memo_cap, s->memo_len + 1, sizeof(value))) return 0;
    s->memo[s->memo_len++] = s->stack[s->sp - 1];
    return 1;
}

static int memo_get(scanner *s, int64_t index) {
    if (index < 0 || index >= s->memo_len) return 0;
    value v = s->memo[index];
    if (v.kind != V_STR && v.kind != V_REBUILD && v.kind != V_ODICT_CLASS && v.kind != V_STORAGE_CLASS &&
        v.kind != V_TENSOR)
        return 0;
    return push(s, v);
}

static int is_line(const scanner *s, int64_t at, const char *text, int64_t len) {
    return at + len <= s->n && memcmp(s->p + at, text, (size_t)len) == 0;
}

static int global(scanner *s) {
    int64_t at = s->pos;
    if (is_line(s, at, "torch._utils\n_rebuild_tensor_v2\n", 32)) {
        s->pos += 32;
        return push(s, (value){V_REBUILD, 0, 0});
    }
    if (is_line(s, at, "collections\nOrderedDict\n", 24)) {
        s->pos += 24;
        return push(s, (value){V_ODICT_CLASS, 0, 0});
    }
    if (!is_line(s, at, "torch\n", 6)) return 0;
    int64_t name = at + 6, end = name;
    while (end < s->n && end - name <= 64) {
        uint8_t c = s->p[end];
        if (c == '\n') break;
        if (!((c >= 'A' && c <= 'Z') || (c >= 'a' && c <= 'z') || (c >= '0' && c <= '9') || c == '_')) return 0;
        end++;
    }
    if (end >= s->n || s->p[end] != '\n' || end - name < 8 || end - name > 64) return 0;
    if (memcmp(s->p + end - 7, "Storage", 7) != 0) return 0;
    s->pos = end + 1;
    return push(s, (value){V_STORAGE_CLASS, name, end - name});
}

static int text_is(const scanner *s, value v, const char *text, int64_t len) {
    return v.kind == V_STR && v.b == len && memcmp(s->p + v.a, text, (size_t)len) == 0;
}

/* A string of first..last bytes but for one: a persistent id's key and location, the text in a dropped _metadata. */
static int chars(const scanner *s, value v, uint8_t first, uint8_t last, uint8_t but) {
    for (int64_t i = 0; i < v.b; i++)
        if (s->p[v.a + i] < first || s->p[v.a + i] > last || s->p[v.a + i] == but) return 0;
    return 1;
}

static int storage_key_ok(const scanner *s, value v) {
    return v.kind == V_STR && v.b >= 1 && v.b <= 256 && chars(s, v, 0x21, 0x7e, '/');
}

static int location_ok(const scanner *s, value v) {
    return v.kind == V_STR && v.b <= 255 && chars(s, v, 0x20, 0x7e, 0x7f);
}

/* A storage key's number: its value where it is decimal without leading zeros (at most 18 digits), else -1. */
static int64_t key_number(const scanner *s, value v) {
    const uint8_t *key = s->p + v.a;
    if (v.b > 18 || (key[0] == '0' && v.b > 1)) return -1;
    int64_t number = 0;
    for (int64_t i = 0; i < v.b; i++) {
        if (key[i] < '0' || key[i] > '9') return -1;
        number = number * 10 + (key[i] - '0');
    }
    return number;
}

/* TUPLE over a frame: int items make a tuple of ints; a persistent id or rebuild arguments become rows. */
static int make_tuple(scanner *s, int64_t from) {
    int64_t count = s->sp - from;
    value *items = s->stack + from;
    int ints = 1;
    for (int64_t i = 0; i < count; i++) ints &= items[i].kind == V_INT;
    value made;
    if (ints) {
        if (!grow((void **)&s->pool.data, &s->pool.cap, s->pool.len + count, sizeof(int64_t))) return 0;
        for (int64_t i = 0; i < count; i++) s->pool.data[s->pool.len + i] = items[i].a;
        made = (value){V_TUPLE, s->pool.len, count};
        s->pool.len += count;
    } else if (count == 5 && text_is(s, items[0], "storage", 7) &&
               items[1].kind == V_STORAGE_CLASS && storage_key_ok(s, items[2]) && location_ok(s, items[3]) &&
               items[4].kind == V_INT && items[4].a >= 0) {
        int64_t row[8] = {items[1].a, items[1].b, items[2].a, items[2].b, items[3].a, items[3].b, items[4].a,
                          key_number(s, items[2])};
        if (!put_row(&s->pids, row, 8)) return 0;
        made = (value){V_PID, s->pids.len / 8 - 1, 0};
    } else if (count == 6 && items[0].kind == V_STORAGE && items[1].kind == V_INT && items[2].kind == V_TUPLE &&
               items[3].kind == V_TUPLE && items[4].kind == V_BOOL && items[5].kind == V_DICT && items[5].a != 0 &&
               !s->filled.data[items[5].a]) {
        int64_t row[6] = {items[0].a, items[1].a, items[2].a, items[2].b, items[3].a, items[4].a};
        if (items[2].b != items[3].b) return 0;
        if (!put_row(&s->args, row, 6)) return 0;
        made = (value){V_ARGS, s->args.len / 6 - 1, 0};
    } else {
        return 0;
    }
    s->sp = from;
    return push(s, made);
}

/* The tensor row of _rebuild_tensor_v2(*args), checked as ckptfs.model.rebuild.make_tensor checks it, except
 * against the storage's size (its dtype is known in Python): the last element's index is a column. */
static int rebuild_tensor(scanner *s, int64_t args_row) {
    const int64_t *a = s->args.data + args_row * 6;
    int64_t storage = a[0], offset = a[1], dims = a[2], rank = a[3], strides = a[4], grad = a[5];
    if (offset < 0 || rank > MAX_RANK) return 0;
    const int64_t *size = s->pool.data + dims, *stride = s->pool.data + strides;
    int zero = 0;
    for (int64_t i = 0; i < rank; i++) {
        if (size[i] < 0 || stride[i] < 0) return 0;
        zero |= size[i] == 0;
    }
    __int128 numel = 1, last = offset;
    if (!zero) {
        for (int64_t i = 0; i < rank; i++) {
            numel *= size[i];
            if (numel > LIMIT_62) return 0;
            last += (__int128)(size[i] - 1) * stride[i];
            if (last >= LIMIT_62) return 0;
        }
    }
    int64_t row[8] = {storage, offset, dims, rank, strides, grad, zero ? 0 : 1, zero ? 0 : (int64_t)last};
    if (!put_row(&s->tensors, row, 8)) return 0;
    return 1;
}

static int ascii(const scanner *s, value v) { return chars(s, v, 0, 0x7e, 0x7f); }

/* SETITEMS or SETITEM: str keys and tensors into the root; into any other dict (an OrderedDict's _metadata, which
 * a BUILD on the root drops, as the reference does) ASCII str keys and plain values only. */
static int set_items(scanner *s, int64_t from, int64_t target) {
    if (target < 0 || s->stack[target].kind != V_DICT || (s->sp - from) % 2) return 0;
    int64_t dict = s->stack[target].a;
    if (dict == 0 && target != 0) return 0;
    s->filled.data[dict] = 1;
    for (int64_t i = from; i < s->sp; i += 2) {
        value key = s->stack[i], item = s->stack[i + 1];
        if (key.kind != V_STR) return 0;
        if (dict == 0) {
            if (item.kind != V_TENSOR) return 0;
            int64_t row[3] = {key.a, key.b, item.a};
            if (!put_row(&s->items, row, 3)) return 0;
        } else {
            int plain = item.kind == V_INT || item.kind == V_BOOL || item.kind == V_NONE ||
                        (item.kind == V_STR && ascii(s, item)) || (item.kind == V_DICT && item.a != 0);
            if (!ascii(s, key) || !plain) return 0;
        }
    }
    s->sp = from;
    return 1;
}

static int step(scanner *s) {
    if (!need(s, 1)) return 0;
    uint8_t op = s->p[s->pos++];
    int64_t base = frame_base(s), at;
    switch (op) {
    case 0x80: /* PROTO */
        if (!need(s, 1) || s->p[s->pos] < 2 || s->p[s->pos] > 5) return 0;
        s->pos++;
        return 1;
    case '}': return new_dict(s);
    case ')': return push(s, (value){V_TUPLE, 0, 0});
    case 'N': return push(s, (value){V_NONE, 0, 0});
    case 0x88: return push(s, (value){V_BOOL, 1, 0});
    case 0x89: return push(s, (value){V_BOOL, 0, 0});
    case 'K': return (at = take(s, 1)) >= 0 && push(s, (value){V_INT, s->p[at], 0});
    case 'M': return (at = take(s, 2)) >= 0 && push(s, (value){V_INT, s->p[at] | s->p[at + 1] << 8, 0});
    case 'J': return (at = take(s, 4)) >= 0 && push(s, (value){V_INT, (int32_t)u32(s->p + at), 0});
    case 0x8a: { /* LONG1 of at most 8 bytes */
        if (!need(s, 1)) return 0;
        int64_t len = s->p[s->pos];
        if (len > 8 || !need(s, 1 + len)) return 0;
        uint64_t v = 0;
        for (int64_t i = len - 1; i >= 0; i--) v = v << 8 | s->p[s->pos + 1 + i];
        if (len > 0 && len < 8 && (s->p[s->pos + len] & 0x80)) v |= ~UINT64_C(0) << (8 * len);
        s->pos += 1 + len;
        return push(s, (value){V_INT, (int64_t)v, 0});
    }
    case 'X':
    case 0x8c: {
        int64_t width = op == 'X' ? 4 : 1;
        if (!need(s, width)) return 0;
        int64_t len = op == 'X' ? (int64_t)u32(s->p + s->pos) : s->p[s->pos];
        s->pos += width;
        if (!need(s, len)) return 0;
        s->pos += len;
        return push(s, (value){V_STR, s->pos - len, len});
    }
    case 'c': return global(s);
    case 'q': return (at = take(s, 1)) >= 0 && memo_put(s, s->p[at]);
    case 'r': return (at = take(s, 4)) >= 0 && memo_put(s, u32(s->p + at));
    case 0x94: return memo_put(s, s->memo_len);
    case 'h': return (at = take(s, 1)) >= 0 && memo_get(s, s->p[at]);
    case 'j': return (at = take(s, 4)) >= 0 && memo_get(s, u32(s->p + at));
    case '(':
        if (s->nframes >= MAX_FRAMES || s->nframes + 2 >= s->max_depth) return 0;
        s->frames[s->nframes++] = s->sp;
        return 1;
    case 't':
        if (!s->nframes) return 0;
        s->nframes--;
        return make_tuple(s, base); /* pushed onto the frame below, with its depth check there */
    case 0x85:
    case 0x86:
    case 0x87:
        if (s->sp - base < op - 0x84) return 0;
        for (int64_t i = s->sp - (op - 0x84); i < s->sp; i++)
            if (s->stack[i].kind != V_INT) return 0;
        return make_tuple(s, s->sp - (op - 0x84));
    case 'Q': {
        if (s->sp - base < 1 || s->stack[s->sp - 1].kind != V_PID) return 0;
        const int64_t *pid = s->pids.data + s->stack[s->sp - 1].a * 8;
        if (!put_row(&s->storages, pid, 8)) return 0;
        s->stack[s->sp - 1] = (value){V_STORAGE, s->storages.len / 8 - 1, 0};
        return 1;
    }
    case 'R': {
        if (s->sp - base < 2) return 0;
        value func = s->stack[s->sp - 2], args = s->stack[s->sp - 1];
        if (func.kind == V_ODICT_CLASS && args.kind == V_TUPLE && args.b == 0) {
            s->sp -= 2;
            return new_dict(s);
        }
        if (func.kind != V_REBUILD || args.kind != V_ARGS || !rebuild_tensor(s, args.a)) return 0;
        s->sp -= 1;
        s->stack[s->sp - 1] = (value){V_TENSOR, s->tensors.len / 8 - 1, 0};
        return 1;
    }
    case 'u':
        if (!s->nframes) return 0;
        s->nframes--;
        return set_items(s, base, frame_base(s) == base ? -1 : base - 1);
    case 's':
        if (s->sp - base < 3) return 0;
        return set_items(s, s->sp - 2, s->sp - 3);
    case 'b': /* BUILD on the root: the reference drops a plain dict's state */
        if (s->sp != 2 || s->nframes || s->stack[0].kind != V_DICT || s->stack[0].a != 0 ||
            s->stack[1].kind != V_DICT || s->stack[1].a == 0)
            return 0;
        s->sp = 1;
        return 1;
    default: return 0;
    }
}

int cs_scan(const uint8_t *data, int64_t len, int64_t max_memo, int64_t max_depth, cs_result *out) {
    memset(out, 0, sizeof *out);
    if (max_depth < 16 || max_memo < 16) return CS_REFUSED;
    scanner s;
    memset(&s, 0, sizeof s);
    int64_t frames[MAX_FRAMES];
    s.p = data;
    s.n = len;
    s.max_memo = max_memo;
    s.max_depth = max_depth;
    s.frames = frames;
    int status = CS_REFUSED;
    while (s.pos < s.n) {
        if (s.p[s.pos] == '.') {
            s.pos++;
            if (s.nframes == 0 && s.sp == 1 && s.stack[0].kind == V_DICT && s.stack[0].a == 0) status = CS_DONE;
            break;
        }
        if (!step(&s)) break;
    }
    free(s.stack);
    free(s.memo);
    free(s.pids.data);
    free(s.args.data);
    free(s.filled.data);
    out->end = s.pos;
    if (status != CS_DONE) {
        free(s.pool.data);
        free(s.storages.data);
        free(s.tensors.data);
        free(s.items.data);
        return status;
    }
    out->pool = s.pool.data;
    out->pool_len = s.pool.len;
    out->storages = s.storages.data;
    out->storage_rows = s.storages.len / 8;
    out->tensors = s.tensors.data;
    out->tensor_rows = s.tensors.len / 8;
    out->items = s.items.data;
    out->item_rows = s.items.len / 3;
    return CS_DONE;
}

void cs_free(cs_result *result) {
    free(result->pool);
    free(result->storages);
    free(result->tensors);
    free(result->items);
    memset(result, 0, sizeof *result);
}
