/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket of powerfs (README.md): a Unix stream socket that takes one command line
 * per connection and answers one line once the command took effect. That is why it is a socket
 * and not a FIFO, whose writer cannot tell when the reader acted.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include "control.h"

#include <errno.h>
#include <fuse.h>
#include <limits.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <sys/un.h>
#include <unistd.h>

#include "cache.h"

static int control_fd = -1;
static char control_path[PATH_MAX];
static struct fuse *fuse_handle; /* for the kernel cache invalidations at clear-cache */

static void *serve(void *arg)
{
	(void)arg;
	for (;;) {
		int c = accept4(control_fd, NULL, NULL, SOCK_CLOEXEC);
		if (c < 0) {
			if (errno == EINTR || errno == ECONNABORTED)
				continue;
			return NULL;
		}
		struct timeval tv = {.tv_sec = 5};
		setsockopt(c, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
		char cmd[128];
		size_t n = 0;
		while (n < sizeof(cmd) - 1) {
			ssize_t r = read(c, cmd + n, sizeof(cmd) - 1 - n);
			if (r <= 0)
				break;
			n += (size_t)r;
			if (memchr(cmd, '\n', n))
				break;
		}
		cmd[n] = '\0';
		cmd[strcspn(cmd, "\r\n")] = '\0';
		char out[512];
		char **stale;
		pc_control(cmd, out, sizeof(out) - 1, &stale);
		/* A process that still has a file open (it survived the "power loss") must not read
		 * the dropped bytes from the kernel's page cache: invalidate it, outside pc_lock (the
		 * kernel may wait for reads in flight, which need the lock to finish). */
		for (size_t i = 0; stale && stale[i]; i++) {
			fuse_invalidate_path(fuse_handle, stale[i]);
			free(stale[i]);
		}
		free(stale);
		size_t len = strlen(out);
		out[len++] = '\n';
		(void)!write(c, out, len);
		close(c);
	}
}

int control_open(const char *path)
{
	if (path[0] != '/') {
		char cwd[PATH_MAX];
		if (!getcwd(cwd, sizeof(cwd)) ||
		    snprintf(control_path, sizeof(control_path), "%s/%s", cwd, path) >= (int)sizeof(control_path))
			return -ENAMETOOLONG;
	} else if (snprintf(control_path, sizeof(control_path), "%s", path) >= (int)sizeof(control_path)) {
		return -ENAMETOOLONG;
	}
	struct sockaddr_un a = {.sun_family = AF_UNIX};
	if (strlen(control_path) >= sizeof(a.sun_path))
		return -ENAMETOOLONG;
	strcpy(a.sun_path, control_path);
	unlink(control_path);
	control_fd = socket(AF_UNIX, SOCK_STREAM | SOCK_CLOEXEC, 0);
	if (control_fd < 0 || bind(control_fd, (struct sockaddr *)&a, sizeof(a)) < 0 || listen(control_fd, 16) < 0)
		return -errno;
	/* Bound and listening before the mount: once `powerfs` returns (it daemonizes after
	 * mounting), commands are accepted; the thread serving them starts with the file system. */
	return 0;
}

void control_start(struct fuse *f)
{
	fuse_handle = f;
	if (control_fd < 0)
		return;
	pthread_t t;
	if (pthread_create(&t, NULL, serve, NULL) == 0)
		pthread_detach(t);
	else
		fprintf(stderr, "powerfs: cannot start the control thread\n");
}

void control_close(void)
{
	if (control_fd >= 0)
		unlink(control_path);
}
