/* SPDX-License-Identifier: Apache-2.0
 *
 * The simulated page cache of powerfs: per backing inode, the bytes written since the last
 * fsync, kept in this process's memory until that file is synced (see README.md for what is
 * and is not modelled). Every function here expects the caller to hold pc_lock, except
 * pc_sync_wait_hold and the pc_control_* entry points, which take it themselves.
 */
#ifndef POWERFS_CACHE_H
#define POWERFS_CACHE_H

#include <pthread.h>
#include <stddef.h>
#include <sys/types.h>

#define PC_PAGE 4096
/* Largest file size the cache accepts (EFBIG above): the page table is one flat array. */
#define PC_MAX_SIZE ((off_t)16 << 30)

struct pc_inode {
	dev_t dev;
	ino_t ino;
	int fd;      /* the backing file, O_RDWR where allowed; owned by the entry */
	int refs;    /* open handles through the mount */
	int linked;  /* still reachable by a name (0 once its last link was removed) */
	int dirty;   /* anything unsynced: pages, a size change, a truncation */
	char *path;  /* its last known path in the mount (for the kernel cache invalidation) */
	off_t size;  /* the size seen through the mount */
	off_t base;  /* bytes [0, base) of the backing file are still the file's contents */
	unsigned char **pages; /* page table; NULL = clean (read from the backing file) */
	size_t npages;         /* length of the page table */
	size_t ndirty;         /* non-NULL pages */
	struct pc_inode *prev, *next;
};

struct pc_stats {
	size_t entries, dirty_files, dirty_bytes, held_syncs;
	unsigned long long syncs, clears, dropped_bytes;
};

extern pthread_mutex_t pc_lock;

/* The entry of an open backing descriptor `fd` (taken over: closed if an entry exists), with
 * `hold` handles more (0 for an operation on a path, such as truncate without a handle). */
struct pc_inode *pc_attach(int fd, int hold, int *err);
/* The entry of (dev, ino) if one is cached and linked, else NULL. */
struct pc_inode *pc_find(dev_t dev, ino_t ino);
/* Drop one handle; frees the entry when nothing needs it any more. */
void pc_release(struct pc_inode *e);
/* Free the entry if no handle uses it and nothing in it is unsynced. */
void pc_maybe_free(struct pc_inode *e);
/* The inode's last name is gone: forget it once no handle uses it. */
void pc_unlinked(struct pc_inode *e);

ssize_t pc_read(struct pc_inode *e, char *buf, size_t size, off_t off);
ssize_t pc_write(struct pc_inode *e, const char *buf, size_t size, off_t off);
int pc_truncate(struct pc_inode *e, off_t size);
/* Write the unsynced state to the backing file (no fsync: the caller does it unlocked). */
int pc_writeback(struct pc_inode *e);

/* Remember `path` (in the mount) as the entry's name. */
void pc_set_path(struct pc_inode *e, const char *path);
/* `from` was renamed to `to`: rename the remembered paths at or below it. */
void pc_renamed(const char *from, const char *to);

/* Block while syncs are held (control `hold-sync`); -EIO if the hold ended in failure. */
int pc_sync_wait_hold(void);

/* Control commands; each returns a reply line (without newline) in `out`. After
 * `clear-cache`, `*stale` is a NULL-terminated array of the paths of open files that lost data
 * (the kernel's cache of their pages must be invalidated; the caller frees it), else NULL. */
void pc_control(const char *cmd, char *out, size_t outlen, char ***stale);

#endif
