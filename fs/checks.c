/* SPDX-License-Identifier: MIT */
/*
 * checks.c - the start's checks against the system, each refusing a start
 * with one line that names what is wrong before anything is created: the
 * store directory exists (and lends the tree its owner and modes), the
 * mount point is a directory no other mount sits on, the socket path names
 * nothing or a dead daemon's socket (and where the default one goes).
 * options.c calls them once the values themselves are valid.
 */
#include "fs_i.h"

#include <ctype.h>
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/un.h>
#include <unistd.h>

#define FAIL(...)                                                                                  \
    do {                                                                                           \
        fprintf(stderr, "shardfs: " __VA_ARGS__);                                                  \
        fputc('\n', stderr);                                                                       \
        return -1;                                                                                 \
    } while (0)

/* <SOCKET_DIR>/<mount point with '/' as '-', odd bytes as '_'>.sock, hashed
 * when too long for sun_path. */
int fs_default_socket(const char *mnt, char *out, size_t outlen)
{
    char name[256];
    size_t n = 0;

    for (const char *p = mnt; *p && n < sizeof(name) - 1; p++) {
        unsigned char ch = (unsigned char)*p;

        if (ch == '/') {
            if (n == 0 || name[n - 1] == '-')
                continue;
            name[n++] = '-';
        } else {
            name[n++] = (isalnum(ch) || ch == '.' || ch == '_') ? (char)ch : '_';
        }
    }
    while (n && name[n - 1] == '-')
        n--;
    name[n] = '\0';
    if (n == 0)
        snprintf(name, sizeof(name), "root");
    if (strlen(SOCKET_DIR) + 1 + strlen(name) + 5 >= outlen) {
        uint64_t h = 0xcbf29ce484222325ull;

        for (const char *p = mnt; *p; p++)
            h = (h ^ (unsigned char)*p) * 0x100000001b3ull;
        snprintf(name + 40, sizeof(name) - 40, "-%016" PRIx64, h);
    }
    snprintf(out, outlen, "%s/%s.sock", SOCKET_DIR, name);
    return 0;
}

/* A backend spec names a scheme ("mem:", "fault:...", "posix:..."); anything
 * else is a directory, checked here so the error names it. */
int fs_check_backend(const char *spec)
{
    struct stat st;

    if (strncmp(spec, "mem", 3) == 0 && (spec[3] == '\0' || spec[3] == ':'))
        return 0;
    /* The daemon serves its peer port to members only (shardfs(8)). */
    if (strncmp(spec, "peer:", 5) == 0 && !strstr(spec, "key="))
        FAIL("backend %.40s: a peer: spec needs key=FILE (the members' key)", spec);
    if (strncmp(spec, "fault:", 6) == 0 || strncmp(spec, "posix:", 6) == 0 ||
        strncmp(spec, "peer:", 5) == 0)
        return 0; /* sfs_backend_open reports what is wrong */
    if (stat(spec, &st) < 0)
        FAIL("BACKEND_DIR %s: %s", spec, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        FAIL("BACKEND_DIR %s: not a directory", spec);
    return 0;
}

/* The directory a backend spec stores in: a plain path, posix:DIR?opts, or
 * the inner spec of fault:OPTS:INNER; NULL for mem: (nothing on disk).
 * Returns a malloc'd path or NULL. */
static char *backend_dir(const char *spec)
{
    if (strncmp(spec, "mem", 3) == 0 && (spec[3] == '\0' || spec[3] == ':'))
        return NULL;
    if (strncmp(spec, "fault:", 6) == 0) {
        const char *inner = strchr(spec + 6, ':');

        return inner ? backend_dir(inner + 1) : NULL;
    }
    if (strncmp(spec, "peer:", 5) == 0) {
        /* k=v,... then ':' and the inner spec; listen=HOST:PORT has a ':'
         * of its own, followed by the port's digits. */
        const char *p = spec + 5;

        for (;;) {
            const char *eq = strchr(p, '=');

            if (!eq)
                return NULL;
            if (eq - p == 6 && strncmp(p, "listen", 6) == 0) {
                p = strchr(eq, ':');
                if (!p)
                    return NULL;
                p++;
                while (isdigit((unsigned char)*p))
                    p++;
            } else {
                p = eq + 1 + strcspn(eq + 1, ",:");
            }
            if (*p == ':')
                return backend_dir(p + 1);
            if (*p != ',')
                return NULL;
            p++;
        }
    }
    if (strncmp(spec, "posix:", 6) == 0) {
        const char *q = strchr(spec + 6, '?');

        return strndup(spec + 6, q ? (size_t)(q - spec - 6) : strlen(spec + 6));
    }
    return strdup(spec);
}

void fs_inode_owner(const char *spec, struct fs *fs)
{
    char *dir = backend_dir(spec);
    struct stat st;

    fs->uid = geteuid();
    fs->gid = getegid();
    fs->perm = 0755;
    if (dir && stat(dir, &st) == 0) {
        fs->uid = st.st_uid;
        fs->gid = st.st_gid;
        fs->perm = st.st_mode & 0777;
    }
    free(dir);
}

/* The kernel lets a mount stack on another; an operator almost never means
 * that, so a mount point that already is one is "busy". */
int fs_check_mountpoint(const char *mnt)
{
    FILE *f = fopen("/proc/self/mountinfo", "re");
    char line[4096];
    struct stat st;
    int busy = 0;

    if (stat(mnt, &st) < 0)
        FAIL("MOUNTPOINT %s: %s", mnt, strerror(errno));
    if (!S_ISDIR(st.st_mode))
        FAIL("MOUNTPOINT %s: not a directory", mnt);
    if (!f)
        return 0;
    while (!busy && fgets(line, sizeof(line), f)) {
        char *save = NULL, *tok = strtok_r(line, " ", &save);

        for (int i = 1; tok && i < 5; i++)
            tok = strtok_r(NULL, " ", &save);
        if (tok) {
            fs_unescape(tok);
            busy = strcmp(tok, mnt) == 0;
        }
    }
    fclose(f);
    if (busy)
        FAIL("MOUNTPOINT %s: busy (already a mount point; unmount it first)", mnt);
    return 0;
}

/* The socket path is replaced at start (a stale socket of a dead daemon is
 * unlinked), so it must name nothing or a socket: anything else (a regular
 * file, a symlink, a directory) is the operator's, refused here. A socket
 * someone answers on belongs to a live daemon: refuse to steal it. */
int fs_check_socket(const char *path, bool default_dir)
{
    struct sockaddr_un sa = {.sun_family = AF_UNIX};
    struct stat st;
    int fd, r;

    if (default_dir && mkdir(SOCKET_DIR, 0755) < 0 && errno != EEXIST)
        FAIL("socket: cannot create %s: %s (use -o socket=PATH)", SOCKET_DIR, strerror(errno));
    if (lstat(path, &st) == 0 && !S_ISSOCK(st.st_mode))
        FAIL("socket=%s: exists and is not a socket (refusing to replace it)", path);
    snprintf(sa.sun_path, sizeof(sa.sun_path), "%s", path);
    fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
    if (fd < 0)
        return 0;
    r = connect(fd, (struct sockaddr *)&sa, sizeof(sa));
    close(fd);
    if (r == 0)
        FAIL("socket=%s: in use by another daemon", path);
    return 0;
}
