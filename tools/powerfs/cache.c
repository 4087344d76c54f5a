/* SPDX-License-Identifier: Apache-2.0
 *
 * The simulated page cache (cache.h). Invariants, for every entry:
 *   - 0 <= base <= size: the backing file's first `base` bytes are still the file's contents
 *     wherever no page is cached; bytes in [base, size) without a cached page read as zeros
 *     (they were cut by a truncation and not written since);
 *   - a cached page holds the file's current contents for its whole range, and zeros beyond
 *     `size` (so that growing the file by a truncation shows zeros, as it must);
 *   - the backing file holds exactly what the last sync left there: clearing the cache makes
 *     the backing file the truth again (size = base = its size).
 */
#define _GNU_SOURCE
#include "cache.h"

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

pthread_mutex_t pc_lock = PTHREAD_MUTEX_INITIALIZER;

static struct pc_inode *entries; /* every live entry, linked or not */
static pthread_cond_t hold_cond = PTHREAD_COND_INITIALIZER;
static int hold_on;
static unsigned long hold_gen;
static struct pc_stats st;

static void list_remove(struct pc_inode *e)
{
	if (e->prev)
		e->prev->next = e->next;
	else
		entries = e->next;
	if (e->next)
		e->next->prev = e->prev;
}

static void drop_pages(struct pc_inode *e)
{
	for (size_t i = 0; i < e->npages; i++)
		free(e->pages[i]);
	free(e->pages);
	e->pages = NULL;
	e->npages = 0;
	e->ndirty = 0;
}

static void maybe_free(struct pc_inode *e)
{
	if (e->refs > 0 || (e->linked && e->dirty))
		return;
	list_remove(e);
	drop_pages(e);
	close(e->fd);
	free(e->path);
	free(e);
}

struct pc_inode *pc_find(dev_t dev, ino_t ino)
{
	for (struct pc_inode *e = entries; e; e = e->next)
		if (e->linked && e->ino == ino && e->dev == dev)
			return e;
	return NULL;
}

struct pc_inode *pc_attach(int fd, int hold, int *err)
{
	struct stat s;
	if (fstat(fd, &s) < 0) {
		*err = -errno;
		close(fd);
		return NULL;
	}
	struct pc_inode *e = pc_find(s.st_dev, s.st_ino);
	if (e) {
		close(fd);
	} else {
		e = calloc(1, sizeof(*e));
		if (!e) {
			*err = -ENOMEM;
			close(fd);
			return NULL;
		}
		e->dev = s.st_dev;
		e->ino = s.st_ino;
		e->fd = fd;
		e->linked = 1;
		e->size = e->base = s.st_size;
		e->next = entries;
		if (entries)
			entries->prev = e;
		entries = e;
	}
	e->refs += hold;
	return e;
}

void pc_set_path(struct pc_inode *e, const char *path)
{
	char *p = strdup(path);
	if (!p)
		return; /* keeps the old name: only the kernel cache invalidation would miss it */
	free(e->path);
	e->path = p;
}

void pc_renamed(const char *from, const char *to)
{
	size_t n = strlen(from);
	for (struct pc_inode *e = entries; e; e = e->next) {
		if (!e->path || strncmp(e->path, from, n) != 0 || (e->path[n] != '\0' && e->path[n] != '/'))
			continue;
		char *p = malloc(strlen(to) + strlen(e->path + n) + 1);
		if (!p)
			continue;
		strcpy(p, to);
		strcat(p, e->path + n);
		free(e->path);
		e->path = p;
	}
}

void pc_release(struct pc_inode *e)
{
	e->refs--;
	maybe_free(e);
}

void pc_maybe_free(struct pc_inode *e)
{
	maybe_free(e);
}

void pc_unlinked(struct pc_inode *e)
{
	e->linked = 0;
	maybe_free(e);
}

/* `n` bytes of the synced contents at `pos`: the backing file below `base`, zeros above. */
static int read_backing(struct pc_inode *e, char *buf, size_t n, off_t pos)
{
	size_t from_file = 0;
	if (pos < e->base)
		from_file = (size_t)(e->base - pos) < n ? (size_t)(e->base - pos) : n;
	size_t got = 0;
	while (got < from_file) {
		ssize_t r = pread(e->fd, buf + got, from_file - got, pos + (off_t)got);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		if (r == 0)
			break; /* the backing file is shorter than `base`: changed behind our back */
		got += (size_t)r;
	}
	memset(buf + got, 0, n - got);
	return 0;
}

static unsigned char *page_at(struct pc_inode *e, size_t pg)
{
	return pg < e->npages ? e->pages[pg] : NULL;
}

ssize_t pc_read(struct pc_inode *e, char *buf, size_t size, off_t off)
{
	if (off >= e->size)
		return 0;
	if ((off_t)size > e->size - off)
		size = (size_t)(e->size - off);
	size_t done = 0;
	while (done < size) {
		off_t pos = off + (off_t)done;
		size_t pg = (size_t)(pos / PC_PAGE), in = (size_t)(pos % PC_PAGE);
		size_t n = PC_PAGE - in < size - done ? PC_PAGE - in : size - done;
		unsigned char *p = page_at(e, pg);
		if (p) {
			memcpy(buf + done, p + in, n);
		} else {
			/* a run of clean pages: one pread */
			while (done + n < size && !page_at(e, pg + 1)) {
				size_t more = size - done - n < PC_PAGE ? size - done - n : PC_PAGE;
				n += more;
				pg++;
			}
			int r = read_backing(e, buf + done, n, pos);
			if (r < 0)
				return r;
		}
		done += n;
	}
	return (ssize_t)done;
}

static int grow_table(struct pc_inode *e, size_t want)
{
	if (want <= e->npages)
		return 0;
	size_t n = e->npages ? e->npages : 16;
	while (n < want)
		n *= 2;
	unsigned char **t = realloc(e->pages, n * sizeof(*t));
	if (!t)
		return -ENOMEM;
	memset(t + e->npages, 0, (n - e->npages) * sizeof(*t));
	e->pages = t;
	e->npages = n;
	return 0;
}

ssize_t pc_write(struct pc_inode *e, const char *buf, size_t size, off_t off)
{
	if (off < 0 || off > PC_MAX_SIZE || (off_t)size > PC_MAX_SIZE - off)
		return -EFBIG;
	if (size == 0)
		return 0;
	off_t end = off + (off_t)size;
	int r = grow_table(e, (size_t)((end + PC_PAGE - 1) / PC_PAGE));
	if (r < 0)
		return r;
	size_t done = 0;
	while (done < size) {
		off_t pos = off + (off_t)done;
		size_t pg = (size_t)(pos / PC_PAGE), in = (size_t)(pos % PC_PAGE);
		size_t n = PC_PAGE - in < size - done ? PC_PAGE - in : size - done;
		if (!e->pages[pg]) {
			unsigned char *p = malloc(PC_PAGE);
			if (!p)
				return done ? (ssize_t)done : -ENOMEM;
			/* A new page starts as the file's current contents (base <= size: all synced). */
			r = read_backing(e, (char *)p, PC_PAGE, (off_t)pg * PC_PAGE);
			if (r < 0) {
				free(p);
				return done ? (ssize_t)done : r;
			}
			e->pages[pg] = p;
			e->ndirty++;
		}
		memcpy(e->pages[pg] + in, buf + done, n);
		done += n;
		e->dirty = 1;
		if (pos + (off_t)n > e->size)
			e->size = pos + (off_t)n;
	}
	return (ssize_t)done;
}

int pc_truncate(struct pc_inode *e, off_t size)
{
	if (size < 0)
		return -EINVAL;
	if (size > PC_MAX_SIZE)
		return -EFBIG;
	if (size < e->size) {
		size_t first_gone = (size_t)((size + PC_PAGE - 1) / PC_PAGE);
		for (size_t pg = first_gone; pg < e->npages; pg++) {
			if (e->pages[pg]) {
				free(e->pages[pg]);
				e->pages[pg] = NULL;
				e->ndirty--;
			}
		}
		unsigned char *p = page_at(e, (size_t)(size / PC_PAGE));
		if (p && size % PC_PAGE)
			memset(p + size % PC_PAGE, 0, PC_PAGE - (size_t)(size % PC_PAGE));
		if (size < e->base)
			e->base = size;
	}
	e->size = size;
	e->dirty = 1;
	return 0;
}

static int pwrite_all(int fd, const unsigned char *buf, size_t n, off_t pos)
{
	while (n > 0) {
		ssize_t r = pwrite(fd, buf, n, pos);
		if (r < 0) {
			if (errno == EINTR)
				continue;
			return -errno;
		}
		buf += r;
		n -= (size_t)r;
		pos += r;
	}
	return 0;
}

int pc_writeback(struct pc_inode *e)
{
	if (!e->dirty)
		return 0;
	/* Cut what a truncation removed first: the pages then land on top, and the final size
	 * extends with zeros exactly where nothing was written since the cut. */
	if (ftruncate(e->fd, e->base) < 0)
		return -errno;
	for (size_t pg = 0; pg < e->npages; pg++) {
		if (!e->pages[pg])
			continue;
		off_t pos = (off_t)pg * PC_PAGE;
		if (pos >= e->size)
			continue;
		size_t n = e->size - pos < PC_PAGE ? (size_t)(e->size - pos) : PC_PAGE;
		int r = pwrite_all(e->fd, e->pages[pg], n, pos);
		if (r < 0)
			return r;
	}
	if (ftruncate(e->fd, e->size) < 0)
		return -errno;
	drop_pages(e);
	e->base = e->size;
	e->dirty = 0;
	st.syncs++;
	return 0;
}

int pc_sync_wait_hold(void)
{
	pthread_mutex_lock(&pc_lock);
	if (!hold_on) {
		pthread_mutex_unlock(&pc_lock);
		return 0;
	}
	unsigned long gen = hold_gen;
	st.held_syncs++;
	while (hold_on && hold_gen == gen)
		pthread_cond_wait(&hold_cond, &pc_lock);
	st.held_syncs--;
	pthread_mutex_unlock(&pc_lock);
	/* A held sync never syncs: its caller was meant to die before it returned. */
	return -EIO;
}

static void clear_cache(char *out, size_t outlen, char ***stale)
{
	size_t files = 0, bytes = 0, open = 0;
	struct pc_inode *next;
	for (struct pc_inode *e = entries; e; e = e->next)
		open += e->dirty && e->refs > 0 && e->path;
	*stale = calloc(open + 1, sizeof(char *));
	open = 0;
	for (struct pc_inode *e = entries; e; e = next) {
		next = e->next;
		if (!e->dirty)
			continue;
		files++;
		if (*stale && e->refs > 0 && e->path)
			(*stale)[open++] = strdup(e->path);
		bytes += e->ndirty * PC_PAGE;
		drop_pages(e);
		struct stat s;
		off_t size = fstat(e->fd, &s) == 0 ? s.st_size : 0;
		e->size = e->base = size;
		e->dirty = 0;
		maybe_free(e);
	}
	st.clears++;
	st.dropped_bytes += bytes;
	snprintf(out, outlen, "ok files=%zu pages_bytes=%zu", files, bytes);
}

void pc_control(const char *cmd, char *out, size_t outlen, char ***stale)
{
	*stale = NULL;
	pthread_mutex_lock(&pc_lock);
	if (strcmp(cmd, "clear-cache") == 0) {
		clear_cache(out, outlen, stale);
	} else if (strcmp(cmd, "hold-sync") == 0) {
		hold_on = 1;
		snprintf(out, outlen, "ok");
	} else if (strcmp(cmd, "fail-held-sync") == 0) {
		size_t held = st.held_syncs;
		hold_on = 0;
		hold_gen++;
		pthread_cond_broadcast(&hold_cond);
		snprintf(out, outlen, "ok failed=%zu", held);
	} else if (strcmp(cmd, "stats") == 0) {
		size_t n = 0, dirty = 0, bytes = 0;
		for (struct pc_inode *e = entries; e; e = e->next) {
			n++;
			dirty += e->dirty != 0;
			bytes += e->ndirty * PC_PAGE;
		}
		snprintf(out, outlen,
			 "ok entries=%zu dirty_files=%zu dirty_bytes=%zu held_syncs=%zu hold=%d syncs=%llu "
			 "clears=%llu dropped_bytes=%llu",
			 n, dirty, bytes, st.held_syncs, hold_on, st.syncs, st.clears, st.dropped_bytes);
	} else {
		snprintf(out, outlen,
			 "error unknown command '%.64s' (clear-cache, hold-sync, fail-held-sync, stats)", cmd);
	}
	pthread_mutex_unlock(&pc_lock);
}
