/* SPDX-License-Identifier: Apache-2.0
 *
 * powerfs: a FUSE pass-through file system that loses unsynced writes on command, to test
 * real processes against power loss (README.md). File data written through the mount stays
 * in this process's memory (cache.c) until the file is fsynced or fdatasynced; the control
 * command `clear-cache` drops it all, leaving every file as its last sync left it. Names and
 * directories go to the backing directory at once.
 *
 *   powerfs [--control SOCKET] BACKING MOUNTPOINT [FUSE options]
 *
 * The control socket is served by control.c.
 */
#define FUSE_USE_VERSION 31
#define _GNU_SOURCE
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <fuse.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include "cache.h"
#include "control.h"

static int root_fd = -1;

enum { H_FILE = 0x66696c65, H_DIR = 0x64697220 };

struct handle {
	int kind;
	int flags;             /* open flags (files) */
	struct pc_inode *e;    /* files */
	DIR *dir;              /* directories */
};

static struct handle *H(struct fuse_file_info *fi)
{
	return fi ? (struct handle *)(uintptr_t)fi->fh : NULL;
}

static struct pc_inode *file_of(struct fuse_file_info *fi)
{
	struct handle *h = H(fi);
	return h && h->kind == H_FILE ? h->e : NULL;
}

/* Paths arrive absolute within the mount; the backing directory is `root_fd`. */
static const char *rel(const char *path)
{
	return path[1] ? path + 1 : ".";
}

static void cached_attrs(struct pc_inode *e, struct stat *s)
{
	s->st_size = e->size;
	s->st_blocks = (e->size + 511) / 512;
}

static int pfs_getattr(const char *path, struct stat *s, struct fuse_file_info *fi)
{
	int r = 0;
	pthread_mutex_lock(&pc_lock);
	struct pc_inode *e = file_of(fi);
	if (e) {
		if (fstat(e->fd, s) < 0)
			r = -errno;
		else
			cached_attrs(e, s);
	} else if (fstatat(root_fd, rel(path), s, AT_SYMLINK_NOFOLLOW) < 0) {
		r = -errno;
	} else if (S_ISREG(s->st_mode) && (e = pc_find(s->st_dev, s->st_ino))) {
		cached_attrs(e, s);
	}
	pthread_mutex_unlock(&pc_lock);
	return r;
}

static int pfs_readlink(const char *path, char *buf, size_t size)
{
	ssize_t n = readlinkat(root_fd, rel(path), buf, size - 1);
	if (n < 0)
		return -errno;
	buf[n] = '\0';
	return 0;
}

static int pfs_mknod(const char *path, mode_t mode, dev_t dev)
{
	return mknodat(root_fd, rel(path), mode, dev) < 0 ? -errno : 0;
}

static int pfs_mkdir(const char *path, mode_t mode)
{
	return mkdirat(root_fd, rel(path), mode) < 0 ? -errno : 0;
}

/* The entry of a regular file whose last link the next operation on `path` removes. */
static struct pc_inode *last_link(const char *path)
{
	struct stat s;
	if (fstatat(root_fd, rel(path), &s, AT_SYMLINK_NOFOLLOW) < 0 || !S_ISREG(s.st_mode) || s.st_nlink != 1)
		return NULL;
	return pc_find(s.st_dev, s.st_ino);
}

static int pfs_unlink(const char *path)
{
	pthread_mutex_lock(&pc_lock);
	struct pc_inode *e = last_link(path);
	int r = unlinkat(root_fd, rel(path), 0) < 0 ? -errno : 0;
	if (r == 0 && e)
		pc_unlinked(e);
	pthread_mutex_unlock(&pc_lock);
	return r;
}

static int pfs_rmdir(const char *path)
{
	return unlinkat(root_fd, rel(path), AT_REMOVEDIR) < 0 ? -errno : 0;
}

static int pfs_symlink(const char *target, const char *path)
{
	return symlinkat(target, root_fd, rel(path)) < 0 ? -errno : 0;
}

static int pfs_rename(const char *from, const char *to, unsigned int flags)
{
	pthread_mutex_lock(&pc_lock);
	struct pc_inode *replaced = NULL;
	if (!(flags & RENAME_EXCHANGE)) {
		struct stat a;
		replaced = last_link(to);
		if (replaced && fstatat(root_fd, rel(from), &a, AT_SYMLINK_NOFOLLOW) == 0 &&
		    a.st_ino == replaced->ino && a.st_dev == replaced->dev)
			replaced = NULL; /* renaming a file onto itself (another link of it) */
	}
	int r = renameat2(root_fd, rel(from), root_fd, rel(to), flags) < 0 ? -errno : 0;
	if (r == 0 && replaced)
		pc_unlinked(replaced);
	if (r == 0 && !(flags & RENAME_EXCHANGE))
		pc_renamed(from, to);
	pthread_mutex_unlock(&pc_lock);
	return r;
}

static int pfs_link(const char *from, const char *to)
{
	return linkat(root_fd, rel(from), root_fd, rel(to), 0) < 0 ? -errno : 0;
}

static int pfs_chmod(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct pc_inode *e = file_of(fi);
	int r = e ? fchmod(e->fd, mode) : fchmodat(root_fd, rel(path), mode, 0);
	return r < 0 ? -errno : 0;
}

static int pfs_chown(const char *path, uid_t uid, gid_t gid, struct fuse_file_info *fi)
{
	struct pc_inode *e = file_of(fi);
	int r = e ? fchown(e->fd, uid, gid) : fchownat(root_fd, rel(path), uid, gid, AT_SYMLINK_NOFOLLOW);
	return r < 0 ? -errno : 0;
}

static int pfs_utimens(const char *path, const struct timespec tv[2], struct fuse_file_info *fi)
{
	struct pc_inode *e = file_of(fi);
	int r = e ? futimens(e->fd, tv) : utimensat(root_fd, rel(path), tv, AT_SYMLINK_NOFOLLOW);
	return r < 0 ? -errno : 0;
}

static int pfs_truncate(const char *path, off_t size, struct fuse_file_info *fi)
{
	int r;
	pthread_mutex_lock(&pc_lock);
	struct pc_inode *e = file_of(fi);
	if (e) {
		r = pc_truncate(e, size);
	} else {
		int fd = openat(root_fd, rel(path), O_RDWR | O_CLOEXEC | O_NOFOLLOW);
		if (fd < 0) {
			r = -errno;
		} else if ((e = pc_attach(fd, 0, &r))) {
			r = pc_truncate(e, size);
			pc_maybe_free(e);
		}
	}
	pthread_mutex_unlock(&pc_lock);
	return r;
}

/* Open a backing file for the cache: read-write where allowed (a later sync writes through
 * this descriptor whichever handle asked), read-only for a read-only open that is refused
 * write access. O_TRUNC is never passed down: the truncation is cached like a write. */
static int open_backing(const char *path, int flags, mode_t mode)
{
	int extra = flags & (O_CREAT | O_EXCL);
	int fd = openat(root_fd, rel(path), O_RDWR | O_CLOEXEC | extra, mode);
	if (fd < 0 && (flags & O_ACCMODE) == O_RDONLY &&
	    (errno == EACCES || errno == EROFS || errno == EPERM || errno == ETXTBSY))
		fd = openat(root_fd, rel(path), O_RDONLY | O_CLOEXEC);
	return fd < 0 ? -errno : fd;
}

static int open_file(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	struct handle *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	int fd = open_backing(path, fi->flags, mode);
	if (fd < 0) {
		free(h);
		return fd;
	}
	int r = 0;
	pthread_mutex_lock(&pc_lock);
	struct pc_inode *e = pc_attach(fd, 1, &r);
	if (e)
		pc_set_path(e, path);
	if (e && (fi->flags & O_TRUNC))
		r = pc_truncate(e, 0);
	pthread_mutex_unlock(&pc_lock);
	if (!e) {
		free(h);
		return r;
	}
	h->kind = H_FILE;
	h->flags = fi->flags;
	h->e = e;
	fi->fh = (uintptr_t)h;
	/* Never keep the kernel's cached pages across opens: after a clear-cache, the next open
	 * must see the backing file's contents, not what the kernel remembered. */
	fi->keep_cache = 0;
	fi->direct_io = 0;
	return 0;
}

static int pfs_create(const char *path, mode_t mode, struct fuse_file_info *fi)
{
	return open_file(path, mode, fi);
}

static int pfs_open(const char *path, struct fuse_file_info *fi)
{
	return open_file(path, 0, fi);
}

static int pfs_read(const char *path, char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	pthread_mutex_lock(&pc_lock);
	ssize_t r = pc_read(file_of(fi), buf, size, off);
	pthread_mutex_unlock(&pc_lock);
	return (int)r;
}

static int pfs_write(const char *path, const char *buf, size_t size, off_t off, struct fuse_file_info *fi)
{
	(void)path;
	if ((H(fi)->flags & O_ACCMODE) == O_RDONLY)
		return -EBADF;
	pthread_mutex_lock(&pc_lock);
	ssize_t r = pc_write(file_of(fi), buf, size, off);
	pthread_mutex_unlock(&pc_lock);
	return (int)r;
}

static int pfs_statfs(const char *path, struct statvfs *s)
{
	(void)path;
	return fstatvfs(root_fd, s) < 0 ? -errno : 0;
}

static int pfs_flush(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	(void)fi;
	return 0; /* close(2) makes nothing durable */
}

static int pfs_release(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	struct handle *h = H(fi);
	pthread_mutex_lock(&pc_lock);
	pc_release(h->e);
	pthread_mutex_unlock(&pc_lock);
	free(h);
	return 0;
}

static int pfs_fsync(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	int r = pc_sync_wait_hold();
	if (r < 0)
		return r;
	struct pc_inode *e = file_of(fi);
	pthread_mutex_lock(&pc_lock);
	r = pc_writeback(e);
	int fd = e->fd;
	pthread_mutex_unlock(&pc_lock);
	if (r < 0)
		return r;
	/* Outside the lock: the handle being synced keeps the entry (and fd) alive meanwhile. */
	r = datasync ? fdatasync(fd) : fsync(fd);
	return r < 0 ? -errno : 0;
}

static int pfs_opendir(const char *path, struct fuse_file_info *fi)
{
	struct handle *h = calloc(1, sizeof(*h));
	if (!h)
		return -ENOMEM;
	int fd = openat(root_fd, rel(path), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (fd < 0 || !(h->dir = fdopendir(fd))) {
		int r = -errno;
		if (fd >= 0)
			close(fd);
		free(h);
		return r;
	}
	h->kind = H_DIR;
	fi->fh = (uintptr_t)h;
	return 0;
}

static int pfs_readdir(const char *path, void *buf, fuse_fill_dir_t filler, off_t off,
		       struct fuse_file_info *fi, enum fuse_readdir_flags flags)
{
	(void)path;
	(void)off;
	(void)flags;
	/* Offset 0 for every entry: libfuse collects the whole listing in one call. */
	DIR *d = H(fi)->dir;
	rewinddir(d);
	struct dirent *de;
	errno = 0;
	while ((de = readdir(d))) {
		struct stat s = {0};
		s.st_ino = de->d_ino;
		s.st_mode = (mode_t)de->d_type << 12;
		if (filler(buf, de->d_name, &s, 0, 0))
			return -ENOMEM;
	}
	return errno ? -errno : 0;
}

static int pfs_releasedir(const char *path, struct fuse_file_info *fi)
{
	(void)path;
	struct handle *h = H(fi);
	closedir(h->dir);
	free(h);
	return 0;
}

static int pfs_fsyncdir(const char *path, int datasync, struct fuse_file_info *fi)
{
	(void)path;
	int r = pc_sync_wait_hold();
	if (r < 0)
		return r;
	/* Names are never cached (README.md), so this only passes the sync on. */
	int fd = dirfd(H(fi)->dir);
	r = datasync ? fdatasync(fd) : fsync(fd);
	return r < 0 ? -errno : 0;
}

static void *pfs_init(struct fuse_conn_info *conn, struct fuse_config *cfg)
{
	/* Every write reaches this process (the kernel must not hold dirty pages of its own),
	 * and attributes are never cached (a file's size changes under the kernel at clear-cache). */
	conn->want &= ~FUSE_CAP_WRITEBACK_CACHE;
	cfg->use_ino = 1;
	cfg->entry_timeout = 0;
	cfg->attr_timeout = 0;
	cfg->negative_timeout = 0;
	cfg->kernel_cache = 0;
	cfg->auto_cache = 0;
	cfg->direct_io = 0; /* the log's recovery scan mmaps segments: direct I/O would refuse */
	/* An unlinked open file is removed at once (not hidden as .fuse_hidden*), and operations
	 * on it arrive with a handle and no path. */
	cfg->hard_remove = 1;
	cfg->nullpath_ok = 1;
	control_start(fuse_get_context()->fuse);
	return NULL;
}

static const struct fuse_operations ops = {
	.init = pfs_init,
	.getattr = pfs_getattr,
	.readlink = pfs_readlink,
	.mknod = pfs_mknod,
	.mkdir = pfs_mkdir,
	.unlink = pfs_unlink,
	.rmdir = pfs_rmdir,
	.symlink = pfs_symlink,
	.rename = pfs_rename,
	.link = pfs_link,
	.chmod = pfs_chmod,
	.chown = pfs_chown,
	.truncate = pfs_truncate,
	.open = pfs_open,
	.read = pfs_read,
	.write = pfs_write,
	.statfs = pfs_statfs,
	.flush = pfs_flush,
	.release = pfs_release,
	.fsync = pfs_fsync,
	.opendir = pfs_opendir,
	.readdir = pfs_readdir,
	.releasedir = pfs_releasedir,
	.fsyncdir = pfs_fsyncdir,
	.create = pfs_create,
	.utimens = pfs_utimens,
};

static int usage(void)
{
	fprintf(stderr,
		"usage: powerfs [--control SOCKET] BACKING MOUNTPOINT [FUSE options, e.g. -f]\n"
		"  Data written under MOUNTPOINT stays in memory until fsync; the control socket takes\n"
		"  one command per connection: clear-cache | hold-sync | fail-held-sync | stats\n");
	return 2;
}

int main(int argc, char *argv[])
{
	int i = 1;
	const char *control = NULL;
	if (i < argc && (!strcmp(argv[i], "-h") || !strcmp(argv[i], "--help")))
		return usage(), 0;
	if (i + 1 < argc && !strcmp(argv[i], "--control")) {
		control = argv[i + 1];
		i += 2;
	}
	if (argc - i < 2)
		return usage();
	const char *backing = argv[i++];
	root_fd = open(backing, O_RDONLY | O_DIRECTORY | O_CLOEXEC);
	if (root_fd < 0) {
		fprintf(stderr, "powerfs: backing directory %s: %s\n", backing, strerror(errno));
		return 1;
	}
	if (control) {
		int r = control_open(control);
		if (r < 0) {
			fprintf(stderr, "powerfs: control socket %s: %s\n", control, strerror(-r));
			return 1;
		}
	}
	/* argv for libfuse: the program name, then MOUNTPOINT and the FUSE options. */
	char **fargv = calloc((size_t)(argc - i + 4), sizeof(char *));
	if (!fargv)
		return 1;
	int fargc = 0;
	fargv[fargc++] = argv[0];
	for (; i < argc; i++)
		fargv[fargc++] = argv[i];
	fargv[fargc++] = "-osubtype=powerfs";
	int r = fuse_main(fargc, fargv, &ops, NULL);
	control_close();
	free(fargv);
	return r;
}
