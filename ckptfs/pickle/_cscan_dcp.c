/* The compiled scanner's third part: a torch.distributed.checkpoint .metadata pickle (FileSystemWriter.finish's
 * pickle.dump(Metadata)) read into rows (ckptfs/formats/dcp_columns.py), a typed stack machine like _cscan.c.
 *
 * It accepts only torch's form: a Metadata object whose state is a dict of a state_dict_metadata dict (str keys,
 * TensorStorageMetadata with TensorProperties' 5-tuple state, torch.Size and a list of ChunkStorageMetadata, or a
 * BytesStorageMetadata), a planner_data dict (str keys, tuples of str and int) or None, a storage_data dict
 * (MetadataIndex keys, _StorageInfo values without transforms) and other attributes of inert values; ASCII strings
 * only; memo gets of strings, globals, scalars, tuples of ints, sizes and inert objects only. Anything else, and
 * any input on which the reference interpreter or dcp_metadata's checks would raise, makes it return CS_REFUSED:
 * the pure-Python paths then parse the same bytes and their value or error is the answer. Limits are passed in and
 * it refuses before reaching them. The DCP classes' objects are made in _cscan_dcp_objects.c.
 */
#include "_cscan_dcp.h"

static int new_container(scanner *s, vec *table, int64_t width, int kind) {
    int64_t row[3] = {kind == V_DICT ? R_EMPTY : -1, 0, 0};
    if (!put(table, row, width)) return 0;
    return push(s, VAL(kind, 0, table->len / width - 1, 0));
}

static int memo_put(scanner *s, int64_t index) {
    if (s->stack.len <= base(s) || index != s->memo.len || s->memo.len + 2 > s->max_memo) return 0;
    return put_value(&s->memo, V(s)[s->stack.len - 1]);
}

static int memo_get(scanner *s, int64_t index) {
    if (index < 0 || index >= s->memo.len) return 0;
    value v = ((value *)s->memo.data)[index];
    /* An inert object (torch's layout and memory format) is got again: only ever read as any value, no BUILD. */
    if (v.kind == V_OBJ && v.sub == G_OTHER) v.a = 1;
    else if (v.kind != V_STR && v.kind != V_GLOBAL && v.kind != V_INT && v.kind != V_BOOL && v.kind != V_NONE &&
             v.kind != V_INTS && v.kind != V_SIZE) /* immutable: a torch.Size is got again as a chunk's */
        return 0;
    return push(s, v);
}

/* A global's kind by its module and name (strings), pushed as the reference's inert Global. */
static int push_global(scanner *s, value module, value name) {
    static const char *const names[] = {"Metadata", "TensorStorageMetadata", "TensorProperties",
                                        "ChunkStorageMetadata", "MetadataIndex"};
    int g = G_OTHER;
    if (is(s, module, "torch.distributed.checkpoint.metadata")) {
        for (int i = 0; i < 5; i++)
            if (is(s, name, names[i])) g = i;
        if (is(s, name, "BytesStorageMetadata")) g = G_BYTES;
    } else if (is(s, module, "torch.distributed.checkpoint.filesystem") && is(s, name, "_StorageInfo")) {
        g = G_INFO;
    } else if (is(s, module, "torch")) {
        g = is(s, name, "Size") ? G_SIZE : G_DTYPE;
    }
    return push(s, VAL(V_GLOBAL, g, name.a, name.b));
}

static int stack_global(scanner *s) {
    if (s->stack.len - base(s) < 2) return 0;
    value module = V(s)[s->stack.len - 2], name = V(s)[s->stack.len - 1];
    if (module.kind != V_STR || name.kind != V_STR) return 0;
    s->stack.len -= 2;
    return push_global(s, module, name);
}

/* A line of GLOBAL's argument, ASCII (the reference decodes it with errors replaced). */
static int line(scanner *s, value *text) {
    int64_t start = s->pos;
    while (s->pos < s->n && s->p[s->pos] != '\n')
        if (s->p[s->pos++] & 0x80) return 0;
    if (s->pos >= s->n || s->pos - start > MAX_COUNT) return 0;
    *text = VAL(V_STR, 0, start, s->pos++ - start);
    return 1;
}

static int text_global(scanner *s) {
    value module, name;
    return line(s, &module) && line(s, &name) && push_global(s, module, name);
}

/* TUPLE over the values from `from` on: ints into the pool, anything else into items. */
static int make_tuple(scanner *s, int64_t from) {
    int64_t count = s->stack.len - from;
    value made;
    if (count > MAX_COUNT) return 0;
    if (!count) {
        s->stack.len = from;
        return push(s, VAL(V_INTS, 0, 0, 0));
    }
    value *v = V(s) + from;
    int ints = 1;
    for (int64_t i = 0; i < count; i++) ints &= v[i].kind == V_INT;
    if (ints) {
        if (!grow(&s->out[CS_DCP_POOL], s->out[CS_DCP_POOL].len + count, sizeof(int64_t))) return 0;
        for (int64_t i = 0; i < count; i++) I64(s->out[CS_DCP_POOL])[s->out[CS_DCP_POOL].len + i] = v[i].a;
        made = VAL(V_INTS, 0, s->out[CS_DCP_POOL].len, count);
        s->out[CS_DCP_POOL].len += count;
    } else {
        made = VAL(V_TUPLE, 0, s->items.len, count);
        for (int64_t i = 0; i < count; i++)
            if (!put_value(&s->items, v[i])) return 0;
    }
    s->stack.len = from;
    return push(s, made);
}

static int string(scanner *s, int64_t width) {
    if (!need(s, width)) return 0;
    int64_t len = width == 4 ? (int64_t)u32(s->p + s->pos) : s->p[s->pos];
    s->pos += width;
    if (!need(s, len) || len > MAX_COUNT) return 0;
    for (int64_t i = 0; i < len; i++)
        if (s->p[s->pos + i] & 0x80) return 0; /* ASCII only: the reference decodes the rest */
    s->pos += len;
    return push(s, VAL(V_STR, 0, s->pos - len, len));
}

static int step(scanner *s) {
    if (!need(s, 1)) return 0;
    uint8_t op = s->p[s->pos++];
    int64_t from = base(s), top = s->stack.len;
    const uint8_t *q = s->p + s->pos;
    switch (op) {
    case 0x80: /* PROTO */
        if (!need(s, 1) || q[0] < 2 || q[0] > 5) return 0;
        s->pos++;
        return 1;
    case 0x95: { /* FRAME */
        if (!need(s, 8)) return 0;
        uint64_t size = 0;
        for (int i = 7; i >= 0; i--) size = size << 8 | q[i];
        s->pos += 8;
        return size <= (uint64_t)(s->n - s->pos);
    }
    case '}': return new_container(s, &s->dicts, 3, V_DICT);
    case ']': return new_container(s, &s->lists, 2, V_LIST);
    case ')': return push(s, VAL(V_INTS, 0, 0, 0));
    case 'N': return push(s, VAL(V_NONE, 0, 0, 0));
    case 0x88: return push(s, VAL(V_BOOL, 0, 1, 0));
    case 0x89: return push(s, VAL(V_BOOL, 0, 0, 0));
    case 'K': return need(s, 1) && ++s->pos && push(s, VAL(V_INT, 0, q[0], 0));
    case 'M': return need(s, 2) && (s->pos += 2) && push(s, VAL(V_INT, 0, q[0] | q[1] << 8, 0));
    case 'J': return need(s, 4) && (s->pos += 4) && push(s, VAL(V_INT, 0, (int32_t)u32(q), 0));
    case 0x8a: { /* LONG1 of at most 8 bytes */
        if (!need(s, 1) || q[0] > 8 || !need(s, 1 + q[0])) return 0;
        int64_t len = q[0];
        uint64_t v = 0;
        for (int64_t i = len - 1; i >= 0; i--) v = v << 8 | q[1 + i];
        if (len > 0 && len < 8 && (q[len] & 0x80)) v |= ~UINT64_C(0) << (8 * len);
        s->pos += 1 + len;
        return push(s, VAL(V_INT, 0, (int64_t)v, 0));
    }
    case 'X': return string(s, 4);
    case 0x8c: return string(s, 1);
    case 0x93: return stack_global(s);
    case 'c': return text_global(s);
    case 'q': return need(s, 1) && ++s->pos && memo_put(s, q[0]);
    case 'r': return need(s, 4) && (s->pos += 4) && memo_put(s, u32(q));
    case 0x94: return memo_put(s, s->memo.len);
    case 'h': return need(s, 1) && ++s->pos && memo_get(s, q[0]);
    case 'j': return need(s, 4) && (s->pos += 4) && memo_get(s, u32(q));
    case '(':
        if (s->nframes >= MAX_FRAMES || s->nframes + 2 >= s->max_depth) return 0;
        s->frames[s->nframes++] = top;
        return 1;
    case 't':
        if (!s->nframes) return 0;
        s->nframes--;
        return make_tuple(s, from);
    case 0x85:
    case 0x86:
    case 0x87:
        if (top - from < op - 0x84) return 0;
        return make_tuple(s, top - (op - 0x84));
    case 'R': return dcp_call(s, 0);
    case 0x81: return dcp_call(s, 1);
    case 'b': return dcp_build(s);
    case 'a':
        if (top - from < 2) return 0;
        return dcp_append(s, top - 1, top - 2);
    case 'e':
        if (!s->nframes) return 0;
        s->nframes--;
        return dcp_append(s, from, base(s) == from ? -1 : from - 1);
    case 's':
        if (top - from < 3) return 0;
        return dcp_set_items(s, top - 2, top - 3);
    case 'u':
        if (!s->nframes) return 0;
        s->nframes--;
        return dcp_set_items(s, from, base(s) == from ? -1 : from - 1);
    default: return 0;
    }
}

int cs_dcp(const uint8_t *data, int64_t len, int64_t max_memo, int64_t max_depth, cs_dcp_result *out) {
    memset(out, 0, sizeof *out);
    if (max_depth < 16 || max_memo < 16) return CS_REFUSED;
    scanner s;
    memset(&s, 0, sizeof s);
    s.p = data;
    s.n = len;
    s.max_memo = max_memo;
    s.max_depth = max_depth;
    for (int i = 0; i < 5; i++) s.role_dict[i] = -1;
    int status = CS_REFUSED;
    while (s.pos < s.n) {
        if (s.p[s.pos] == '.') {
            s.pos++;
            if (s.nframes == 0 && s.stack.len == 1 && V(&s)[0].kind == V_ROOT && dcp_join(&s)) status = CS_DONE;
            break;
        }
        if (!step(&s)) break;
    }
    vec *scratch[] = {&s.stack, &s.memo, &s.items, &s.entries, &s.dicts, &s.lists, &s.index, &s.info};
    for (size_t i = 0; i < sizeof scratch / sizeof *scratch; i++) free(scratch[i]->data);
    out->end = s.pos;
    for (int i = 0; i < CS_DCP_TABLES; i++) {
        if (status == CS_DONE) {
            out->tables[i] = s.out[i].data;
            out->lens[i] = s.out[i].len;
        } else {
            free(s.out[i].data);
        }
    }
    return status;
}

void cs_dcp_free(cs_dcp_result *result) {
    for (int i = 0; i < CS_DCP_TABLES; i++) free(result->tables[i]);
    memset(result, 0, sizeof *result);
}
