/* SPDX-License-Identifier: Apache-2.0
 *
 * The control socket of powerfs (control.c).
 */
#ifndef POWERFS_CONTROL_H
#define POWERFS_CONTROL_H

struct fuse;

/* Bind and listen on `path` before the mount (0 or -errno): once `powerfs` returns (it
 * daemonizes after mounting), commands are accepted. */
int control_open(const char *path);
/* Serve commands from a thread of their own (called when the file system starts). */
void control_start(struct fuse *f);
/* Remove the socket file at exit. */
void control_close(void);

#endif
