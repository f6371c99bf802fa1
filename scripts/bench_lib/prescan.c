/* The pre-scan of parse_breakdown.py in C, to time it: opcode boundaries, argument lengths, memo indices,
 * stack and MARK depth, up to STOP. Returns the number of opcodes, or -1 for anything else.
 * Built by parse_breakdown.py with: gcc -O2 -shared -fPIC -o prescan.so prescan.c */
#include <stddef.h>
#include <stdint.h>
#include <string.h>

static uint64_t le(const unsigned char *p, int width) {
    uint64_t v = 0;
    for (int i = width - 1; i >= 0; i--) v = v << 8 | p[i];
    return v;
}

long long prescan(const unsigned char *data, size_t end, uint64_t max_memo, int64_t max_depth,
                  int64_t *marks) {
    static signed char fixed[256], effect[256], after_mark[256];
    static int ready;
    if (!ready) {
        memset(fixed, -1, sizeof fixed);
        memset(effect, 100, sizeof effect);
        memset(after_mark, -1, sizeof after_mark);
        for (const char *p = "(012)t]}Nldsu\x88\x89" "aeb\x81\x85\x86\x87\x8f\x90\x91\x92\x93\x94RQo"; *p; p++)
            fixed[(unsigned char)*p] = 0;
        for (const char *p = "KhqU\x8c" "C\x80"; *p; p++) fixed[(unsigned char)*p] = 1;
        fixed['M'] = 2;
        for (const char *p = "JjrG"; *p; p++) fixed[(unsigned char)*p] = 4;
        fixed[0x95] = 8;
        for (const char *p = "KMJGIFLSTUVXBC\x8a\x8b\x8c\x8d\x8e\x96)]}N\x88\x89\x8fhjgc2P"; *p; p++)
            effect[(unsigned char)*p] = 1;
        for (const char *p = "qrp\x94Q\x85\x95\x80"; *p; p++) effect[(unsigned char)*p] = 0;
        for (const char *p = "0Rb\x81\x93\x86" "a"; *p; p++) effect[(unsigned char)*p] = -1;
        for (const char *p = "\x92\x87s"; *p; p++) effect[(unsigned char)*p] = -2;
        for (const char *p = "tldio\x91"; *p; p++) after_mark[(unsigned char)*p] = 1;
        for (const char *p = "ue\x90" "1"; *p; p++) after_mark[(unsigned char)*p] = 0;
        ready = 1;
    }
    size_t pos = 0;
    int64_t depth = 0, nmarks = 0;
    long long count = 0;
    while (pos < end) {
        unsigned char op = data[pos++];
        count++;
        if (fixed[op] >= 0) {
            if (pos + fixed[op] > end) return -1;
            if ((op == 'r' || op == 'j') && le(data + pos, 4) >= max_memo) return -1;
            pos += fixed[op];
        } else if (op == 'T' || op == 'X' || op == 'B' || op == 0x8d || op == 0x8e || op == 0x96
                   || op == 0x8a || op == 0x8b) {
            int width = (op == 0x8a) ? 1 : (op == 0x8d || op == 0x8e || op == 0x96) ? 8 : 4;
            if (pos + width > end) return -1;
            uint64_t n = le(data + pos, width);
            pos += width;
            if (n > end - pos) return -1;
            pos += n;
        } else if (strchr("ILFSVgpPci", op) && op) {
            int lines = (op == 'c' || op == 'i') ? 2 : 1;
            for (int i = 0; i < lines; i++) {
                const unsigned char *nl = memchr(data + pos, '\n', end - pos);
                if (!nl) return -1;
                pos = (size_t)(nl - data) + 1;
            }
        } else if (op == '.') {
            return count;
        } else {
            return -1;
        }
        if (effect[op] != 100) {
            depth += effect[op];
            if (depth < 0 || depth >= max_depth) return -1;
        } else if (op == '(') {
            if (nmarks + 1 >= max_depth) return -1;
            marks[nmarks++] = depth;
        } else {
            if (nmarks == 0 || after_mark[op] < 0) return -1;
            depth = marks[--nmarks] + after_mark[op];
        }
    }
    return -1;
}
