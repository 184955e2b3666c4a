/* SPDX-License-Identifier: MIT */
/*
 * copier_host.c - the host copier: memcpy between the data plane and host
 * destinations. Used when there is no GPU, when the library was built
 * without CUDA, and for the scheduler-free test and benchmark paths.
 */
#include "copier_i.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>

static int host_copy(struct sfs_copier *cp, struct sfs_copy *v, size_t n)
{
    for (size_t i = 0; i < n; i++) {
        if (!v[i].dst || !v[i].src) {
            v[i].result = -EFAULT;
            continue;
        }
        memcpy(v[i].dst, v[i].src, v[i].len);
        v[i].result = 0;
    }
    return 0;
}

static void host_close(struct sfs_copier *cp)
{
    free(cp);
}

static const struct sfs_copier_ops host_ops = {
    .name = "host",
    .host_memory = true,
    .load = host_copy,
    .dump = host_copy,
    .close = host_close,
    .load_inline = host_copy, /* memcpy: any thread */
};

struct sfs_copier *sfs_copier_host_open(int *err)
{
    struct sfs_copier *cp = calloc(1, sizeof(*cp));

    if (!cp) {
        *err = -ENOMEM;
        return NULL;
    }
    cp->ops = &host_ops;
    return cp;
}
