/* SPDX-License-Identifier: MIT */
/*
 * peer_spec.c - the peer backend's spec options (design.md, section 11):
 *
 *   peer:listen=ADDR:PORT,members=FILE,ways=N,capacity=SIZE[,slot=SIZE]
 *        [,deadline_ms=N][,key=FILE]:<inner spec>
 *
 * Every value is checked here, with a one-line reason for a bad one.
 */
#include "peer_backend_i.h"

#include <ctype.h>
#include <errno.h>
#include <string.h>

static int parse_size(const char *v, size_t n, uint64_t *out)
{
    uint64_t x = 0, mul = 1;
    size_t i = 0;

    if (n == 0 || !isdigit((unsigned char)v[0]))
        return -EINVAL;
    for (; i < n && isdigit((unsigned char)v[i]); i++) {
        if (x > (UINT64_MAX - 9) / 10)
            return -EINVAL;
        x = x * 10 + (uint64_t)(v[i] - '0');
    }
    if (i < n) {
        switch (v[i] | 0x20) {
        case 'k':
            mul = 1ull << 10;
            break;
        case 'm':
            mul = 1ull << 20;
            break;
        case 'g':
            mul = 1ull << 30;
            break;
        case 't':
            mul = 1ull << 40;
            break;
        default:
            return -EINVAL;
        }
        if (i + 1 != n)
            return -EINVAL;
    }
    if (x > UINT64_MAX / mul)
        return -EINVAL;
    *out = x * mul;
    return 0;
}

int sfs_peer_parse(const char *s, struct sfs_peer_opts *o, const char **inner, char *errbuf,
                   size_t errlen)
{
    const char *p = s;

    memset(o, 0, sizeof(*o));
    o->ways = 4;
    o->deadline_ms = PEER_DEADLINE_MS;
    for (;;) {
        const char *eq = strchr(p, '='), *v, *end;
        size_t klen, vlen;
        uint64_t x;

        if (!eq || strcspn(p, ",:") < (size_t)(eq - p)) {
            sfs_errf(errbuf, errlen, "peer spec: expected key=value at '%.40s'", p);
            return -EINVAL;
        }
        klen = (size_t)(eq - p);
        v = eq + 1;
        if (klen == 6 && strncmp(p, "listen", 6) == 0) {
            /* host:port or [v6]:port; the port is digits. */
            const char *c = v[0] == '[' ? strchr(v, ']') : v;

            c = c ? strchr(c, ':') : NULL;
            if (!c || !isdigit((unsigned char)c[1])) {
                sfs_errf(errbuf, errlen, "peer spec: listen= wants ADDR:PORT");
                return -EINVAL;
            }
            end = c + 1;
            while (isdigit((unsigned char)*end))
                end++;
        } else {
            end = v + strcspn(v, ",:");
        }
        vlen = (size_t)(end - v);
        if (vlen == 0 || vlen >= sizeof(o->listen)) {
            sfs_errf(errbuf, errlen, "peer spec: empty or too long value for '%.*s'", (int)klen, p);
            return -EINVAL;
        }
        if (klen == 6 && strncmp(p, "listen", 6) == 0) {
            memcpy(o->listen, v, vlen);
        } else if (klen == 7 && strncmp(p, "members", 7) == 0) {
            memcpy(o->members, v, vlen);
        } else if (klen == 3 && strncmp(p, "key", 3) == 0) {
            memcpy(o->key, v, vlen);
        } else if (klen == 4 && strncmp(p, "ways", 4) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0 || x > PEER_WAYS_MAX)
                goto bad;
            o->ways = (uint32_t)x;
        } else if (klen == 8 && strncmp(p, "capacity", 8) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0)
                goto bad;
            o->capacity = x;
        } else if (klen == 4 && strncmp(p, "slot", 4) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0 || x > PEER_PAYLOAD_MAX)
                goto bad;
            o->slot = (uint32_t)x;
        } else if (klen == 11 && strncmp(p, "deadline_ms", 11) == 0) {
            if (parse_size(v, vlen, &x) < 0 || x == 0 || x > 600000)
                goto bad;
            o->deadline_ms = (unsigned)x;
        } else {
            sfs_errf(errbuf, errlen,
                     "peer spec: unknown option '%.*s' (listen, members, ways, capacity, slot, "
                     "deadline_ms, key)",
                     (int)klen, p);
            return -EINVAL;
        }
        if (*end == ',') {
            p = end + 1;
            continue;
        }
        if (*end == ':') {
            *inner = end + 1;
            break;
        }
        sfs_errf(errbuf, errlen, "peer spec: missing ':<inner spec>'");
        return -EINVAL;
    bad:
        sfs_errf(errbuf, errlen, "peer spec: bad value '%.*s' for '%.*s'", (int)vlen, v, (int)klen,
                 p);
        return -EINVAL;
    }
    if (!o->listen[0] || !o->capacity) {
        sfs_errf(errbuf, errlen, "peer spec: listen= and capacity= are required");
        return -EINVAL;
    }
    return 0;
}
