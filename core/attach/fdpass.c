/* SPDX-License-Identifier: MIT */
/*
 * fdpass.c - one message with descriptors attached (SCM_RIGHTS), the
 * transport of the attach protocol (attach_i.h) in both directions.
 *
 * Bounds: at most FDS_PER_MSG descriptors a message, in a control buffer on
 * the stack; a receiver never keeps more than it asked for and never leaks
 * what it does not keep.
 */
#include "attach_i.h"

#include <errno.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

int sfs_fds_send(int sock, const void *buf, size_t len, const int *fds, unsigned nfds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * FDS_PER_MSG)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = (void *)buf, .iov_len = len};
    struct msghdr msg = {.msg_iov = &iov, .msg_iovlen = 1};
    ssize_t n;

    if (nfds > FDS_PER_MSG)
        return -EINVAL;
    if (nfds) {
        memset(&u, 0, sizeof(u));
        msg.msg_control = u.buf;
        msg.msg_controllen = CMSG_SPACE(sizeof(int) * nfds);
        struct cmsghdr *cm = CMSG_FIRSTHDR(&msg);
        cm->cmsg_level = SOL_SOCKET;
        cm->cmsg_type = SCM_RIGHTS;
        cm->cmsg_len = CMSG_LEN(sizeof(int) * nfds);
        memcpy(CMSG_DATA(cm), fds, sizeof(int) * nfds);
    }
    do
        n = sendmsg(sock, &msg, MSG_NOSIGNAL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    return (size_t)n == len ? 0 : -EIO;
}

int sfs_fds_recv(int sock, void *buf, size_t len, int *fds, unsigned max_fds)
{
    union {
        char buf[CMSG_SPACE(sizeof(int) * FDS_PER_MSG)];
        struct cmsghdr align;
    } u;
    struct iovec iov = {.iov_base = buf, .iov_len = len};
    struct msghdr msg = {
        .msg_iov = &iov, .msg_iovlen = 1, .msg_control = u.buf, .msg_controllen = sizeof(u.buf)};
    ssize_t n;
    int got = 0;

    do
        n = recvmsg(sock, &msg, MSG_CMSG_CLOEXEC | MSG_WAITALL);
    while (n < 0 && errno == EINTR);
    if (n < 0)
        return -errno;
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(&msg); cm; cm = CMSG_NXTHDR(&msg, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        int k = (int)((cm->cmsg_len - CMSG_LEN(0)) / sizeof(int));
        int *in = (int *)CMSG_DATA(cm);
        for (int i = 0; i < k; i++) {
            if ((unsigned)got < max_fds)
                fds[got++] = in[i];
            else
                close(in[i]); /* more than announced: never leak */
        }
    }
    if ((size_t)n != len || (msg.msg_flags & MSG_CTRUNC)) {
        /* Closed here, so never again by the caller: the welcome's slot is
         * the handle's ctl_fd, which the handle's free would close too. */
        for (int i = 0; i < got; i++) {
            close(fds[i]);
            fds[i] = -1;
        }
        return -EBADMSG;
    }
    return got;
}
