/*
 * graphd data plane: the fixed-size binary frames exchanged over the session
 * socket (see docs/PROTOCOL.md). Shared by the daemon and libgraphd; header
 * only, no dependencies beyond libc.
 *
 * Every frame is GRAPHD_FRAME_SIZE bytes, little-endian, and may be followed
 * by msg_len bytes: UTF-8 text in an error reply, binary in the few frames
 * that say so (a MAP reply for device memory, EVENTS both ways). Requests come from
 * the client; each is answered by one reply frame whose type is the request
 * type with GRAPHD_FRAME_REPLY set and whose seq echoes the request's.
 */
#ifndef GRAPHD_FRAME_H
#define GRAPHD_FRAME_H

#include <endian.h>
#include <stdint.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#define GRAPHD_FRAME_MAGIC 0x44505247u /* "GRPD" as little-endian bytes */
#define GRAPHD_FRAME_VERSION 2         /* 2: devices as GRAPHD_DEVICE_CODE */
#define GRAPHD_FRAME_SIZE 40
#define GRAPHD_FRAME_MAX_MSG 1024

enum graphd_frame_type {
    GRAPHD_FRAME_ATTACH = 1, /* id = session id, arg = session token */
    /* id = region id; reply arg = size. Host region: the reply carries the memfd (SCM_RIGHTS).
     * Device region (AllocRegionReply.device names it): cuda: the message is its CUDA IPC memory
     * handle (GRAPHD_IPC_HANDLE_SIZE bytes); xpu: the message is its Level Zero IPC handle
     * (GRAPHD_IPC_HANDLE_SIZE bytes) and the reply carries the allocation's fd (SCM_RIGHTS),
     * which the client writes into the handle's first 4 bytes before zeMemOpenIpcHandle. With
     * GRAPHD_MAP_NAME_DEVICE in the request's arg, a device region's reply names its device:
     * GRAPHD_MAP_DEVICE_PAYLOAD bytes, the handle then the device's GRAPHD_DEVICE_CODE. */
    GRAPHD_FRAME_MAP = 2,
    GRAPHD_FRAME_REPLAY = 3, /* id = graph id, arg = phase | flags; reply arg = daemon time, ns */
    /* id = GRAPHD_DEVICE_CODE. cuda: request and reply each carry a CUDA IPC event handle
     * (GRAPHD_IPC_HANDLE_SIZE bytes of message): the client's, recorded after it writes a
     * replay's inputs, and the daemon's, recorded after the replay (GRAPHD_REPLAY_ORDERED).
     * xpu: the request carries nothing and arg = the number of events (0: the daemon's default);
     * the reply's arg is that number, its message the Level Zero IPC handle of the session's event
     * pool on the device (GRAPHD_IPC_HANDLE_SIZE bytes), and the pool's fd comes with it
     * (SCM_RIGHTS), written into the handle's first 4 bytes before zeEventPoolOpenIpcHandle. */
    GRAPHD_FRAME_EVENTS = 4,
    /* id = GRAPHD_DEVICE_CODE; the reply carries the CUDA IPC memory handle of the session's
     * sequence counters on that device (GRAPHD_SEQ_*), for GRAPHD_REPLAY_POSTED. */
    GRAPHD_FRAME_SEQ = 5,
    /* id = graph id, arg = 0 or GRAPHD_DIRECT_RENEW: the session's replay connection to the
     * executor that holds the graph (docs/PROTOCOL.md, "Replay connections"). The reply's arg
     * names the connection (one per executor); a new one comes with the reply as a socket
     * (SCM_RIGHTS), one the session already has comes without. REPLAY frames for the graph then
     * go on that socket, and their answers come back there. */
    GRAPHD_FRAME_DIRECT = 6,
    /* On a replay connection only: the client's replay ring (graphd_ring_t) for posted replays,
     * a sealed memfd of GRAPHD_RING_BYTES that comes with the frame (SCM_RIGHTS). The OK reply's
     * arg is GRAPHD_RING_SLOTS. From then on the client's posted replays go into the ring and
     * no longer as REPLAY frames on that connection. */
    GRAPHD_FRAME_RING = 7,
    /* On a replay connection with a ring: the executor was asleep when the client put a replay
     * into the ring (graphd_ring_t.asleep); no reply. */
    GRAPHD_FRAME_WAKE = 8,
    GRAPHD_FRAME_ERROR = 0x7fff, /* unsolicited: the daemon closes the session after it */
    GRAPHD_FRAME_REPLY = 0x8000,
};

/* DIRECT arg: a new connection, dropping the one the session has to that executor. */
#define GRAPHD_DIRECT_RENEW 1u

#define GRAPHD_IPC_HANDLE_SIZE 64 /* a cudaIpcMemHandle_t or cudaIpcEventHandle_t */

/* MAP arg: an OK reply for a device region names its device (a daemon that predates it ignores
 * the bit and sends the handle alone). */
#define GRAPHD_MAP_NAME_DEVICE 1u
/* That reply's message: the IPC handle, then the device's GRAPHD_DEVICE_CODE, 64-bit
 * little-endian. */
#define GRAPHD_MAP_DEVICE_PAYLOAD (GRAPHD_IPC_HANDLE_SIZE + 8)

/*
 * A device in a frame (EVENTS and SEQ ids, the REPLAY_POSTED device field): its family and its
 * index within the family, in one byte, so that "cuda:0" and "xpu:0" never read alike. The
 * family codes are the wire's, not any library's.
 */
enum graphd_device_family {
    GRAPHD_DEVICE_CPU = 0,
    GRAPHD_DEVICE_CUDA = 1,
    GRAPHD_DEVICE_XPU = 2,
};
#define GRAPHD_DEVICE_FAMILY_SHIFT 6
#define GRAPHD_DEVICE_INDEX_MAX 63u /* indices 0..63 within a family */
#define GRAPHD_DEVICE_CODE(family, index)                                                          \
    ((uint64_t)(((unsigned)(family) << GRAPHD_DEVICE_FAMILY_SHIFT) |                               \
                (GRAPHD_DEVICE_INDEX_MAX & (unsigned)(index))))
#define GRAPHD_DEVICE_CODE_FAMILY(code) ((unsigned)((code) >> GRAPHD_DEVICE_FAMILY_SHIFT) & 3u)
#define GRAPHD_DEVICE_CODE_INDEX(code) (GRAPHD_DEVICE_INDEX_MAX & (unsigned)(code))

/* REPLAY arg: the phase in the low byte, flags in the next. */
#define GRAPHD_REPLAY_PHASE_MASK 0xffu
#define GRAPHD_REPLAY_FLAGS_MASK 0xff00u
/* The daemon orders the replay by the session's events for the graph's device (EVENTS): the
 * pool's stream waits on the client's event, the daemon records its own after the graph and
 * replies without waiting for the device. Device-resident graphs only. */
#define GRAPHD_REPLAY_ORDERED 0x100u
/*
 * A posted replay, ordered by the session's sequence counters on the device (SEQ) with CUDA
 * stream memory operations, and answered only when it fails. The arg carries the device's
 * GRAPHD_DEVICE_CODE (GRAPHD_REPLAY_DEVICE) and the replay's sequence number n (GRAPHD_REPLAY_SEQ:
 * 1 for the session's first posted replay on the device, then one more each time, refused
 * otherwise). Before the frame the client's stream waits for ready >= n - 1 (the previous replay's
 * write, which may be on another stream) and writes ready = n; after it, the client's stream waits
 * for done >= n. The daemon's stream waits for ready >= n, replays, and writes done = n (also when
 * the replay fails, so that the client's stream goes on); a failure is answered by an error
 * reply with the frame's seq, which the client reads at a later call. Device-resident graphs
 * only.
 */
#define GRAPHD_REPLAY_POSTED 0x200u
#define GRAPHD_REPLAY_DEVICE_SHIFT 16
#define GRAPHD_REPLAY_DEVICE_MASK 0xffu
#define GRAPHD_REPLAY_SEQ_SHIFT 24
#define GRAPHD_REPLAY_SEQ_MAX ((UINT64_C(1) << 40) - 1)
/* The sequence counters (SEQ): two 64-bit little-endian counters in device memory, 0 at first. */
#define GRAPHD_SEQ_BYTES 256
#define GRAPHD_SEQ_READY_OFFSET 0  /* written by the client's stream */
#define GRAPHD_SEQ_DONE_OFFSET 128 /* written by the daemon's stream */
/* What either side writes to end every wait on the counters when the session ends. */
#define GRAPHD_SEQ_RELEASED (UINT64_C(1) << 62)

/*
 * A replay ring (GRAPHD_FRAME_RING): memory the client shares with the executor, so that a posted
 * replay costs the client a few stores instead of a send, and the executor a load instead of a
 * receive. The client writes slot[head % GRAPHD_RING_SLOTS] (a REPLAY frame's seq, id and arg, a
 * POSTED replay), then head + 1 (release). The executor takes slots from its own count of what it
 * took (never from what the memory says), publishes that count as tail, and refuses a head more
 * than GRAPHD_RING_SLOTS ahead of it. Before it may sleep in poll the executor sets asleep = 1,
 * then looks at head again; the client, after writing head, reads asleep and sends a WAKE frame
 * when it is set (both with a full fence between the store and the load, so that one of the two
 * sees the other). A posted replay that fails is answered on the socket as before, and failed is
 * raised after the answer is queued: the client reads the socket when failed moved. All fields
 * are 64-bit little-endian (asleep 32-bit), each on a cache line of its own.
 */
#define GRAPHD_RING_SLOTS 4096 /* as deep as a replay connection's socket buffer, about */
#define GRAPHD_RING_BYTES                                                                          \
    (4096 + GRAPHD_RING_SLOTS * 32) /* 135168: a page of counters, the slots */
typedef struct graphd_ring_slot {
    uint64_t seq, id, arg, zero;
} graphd_ring_slot_t;
typedef struct graphd_ring {
    uint64_t head; /* client: slots written */
    uint8_t pad0[56];
    uint64_t tail; /* executor: slots taken */
    uint8_t pad1[56];
    uint32_t asleep; /* executor: 1 while it may sleep in poll */
    uint8_t pad2[60];
    uint64_t failed; /* executor: posted replays of the ring answered with an error so far */
    uint8_t pad3[56];
    graphd_ring_slot_t slot[GRAPHD_RING_SLOTS];
} graphd_ring_t;
_Static_assert(sizeof(graphd_ring_t) <= GRAPHD_RING_BYTES, "graphd_ring_t fits GRAPHD_RING_BYTES");

/* Room for one descriptor's SCM_RIGHTS message (graphd_attach_fd). */
typedef union {
    struct cmsghdr align;
    char buf[CMSG_SPACE(sizeof(int))];
} graphd_fd_control_t;

/* Makes mh pass fd (SCM_RIGHTS) with its first byte, in ctl: the daemon's replies (a region's
 * memfd, a replay connection) and the client's RING (its ring's memfd). */
static inline void graphd_attach_fd(struct msghdr *mh, graphd_fd_control_t *ctl, int fd)
{
    memset(ctl, 0, sizeof *ctl);
    mh->msg_control = ctl->buf;
    mh->msg_controllen = sizeof ctl->buf;
    struct cmsghdr *cm = CMSG_FIRSTHDR(mh);
    cm->cmsg_level = SOL_SOCKET;
    cm->cmsg_type = SCM_RIGHTS;
    cm->cmsg_len = CMSG_LEN(sizeof(int));
    memcpy(CMSG_DATA(cm), &fd, sizeof fd);
}

/* Takes the descriptors out of a received message's SCM_RIGHTS data: the first to *keep while
 * *keep is still -1 (keep NULL: none kept), every other one closed, so that no descriptor a peer
 * passes is left open unseen. The client (a reply's fd) and the executor (RING's memfd) use it. */
static inline void graphd_take_fds(struct msghdr *mh, int *keep)
{
    for (struct cmsghdr *cm = CMSG_FIRSTHDR(mh); cm != NULL; cm = CMSG_NXTHDR(mh, cm)) {
        if (cm->cmsg_level != SOL_SOCKET || cm->cmsg_type != SCM_RIGHTS)
            continue;
        size_t nfds = (cm->cmsg_len - CMSG_LEN(0)) / sizeof(int);
        for (size_t i = 0; i < nfds; i++) {
            int fd;
            memcpy(&fd, CMSG_DATA(cm) + i * sizeof(int), sizeof(int));
            if (keep != NULL && *keep < 0)
                *keep = fd;
            else
                close(fd);
        }
    }
}

/* status in replies is a gRPC status code, so both planes report errors alike. */
typedef struct graphd_frame {
    uint32_t magic;
    uint16_t version;
    uint16_t type;
    uint64_t seq;
    uint64_t id;
    uint64_t arg;
    int32_t status;
    uint32_t msg_len; /* bytes of message text after the frame */
} graphd_frame_t;

static inline void graphd_frame_encode(const graphd_frame_t *f, uint8_t out[GRAPHD_FRAME_SIZE])
{
    uint32_t u32;
    uint16_t u16;
    uint64_t u64;
    u32 = htole32(f->magic), memcpy(out + 0, &u32, 4);
    u16 = htole16(f->version), memcpy(out + 4, &u16, 2);
    u16 = htole16(f->type), memcpy(out + 6, &u16, 2);
    u64 = htole64(f->seq), memcpy(out + 8, &u64, 8);
    u64 = htole64(f->id), memcpy(out + 16, &u64, 8);
    u64 = htole64(f->arg), memcpy(out + 24, &u64, 8);
    u32 = htole32((uint32_t)f->status), memcpy(out + 32, &u32, 4);
    u32 = htole32(f->msg_len), memcpy(out + 36, &u32, 4);
}

static inline void graphd_frame_decode(const uint8_t in[GRAPHD_FRAME_SIZE], graphd_frame_t *f)
{
    uint32_t u32;
    uint16_t u16;
    uint64_t u64;
    memcpy(&u32, in + 0, 4), f->magic = le32toh(u32);
    memcpy(&u16, in + 4, 2), f->version = le16toh(u16);
    memcpy(&u16, in + 6, 2), f->type = le16toh(u16);
    memcpy(&u64, in + 8, 8), f->seq = le64toh(u64);
    memcpy(&u64, in + 16, 8), f->id = le64toh(u64);
    memcpy(&u64, in + 24, 8), f->arg = le64toh(u64);
    memcpy(&u32, in + 32, 4), f->status = (int32_t)le32toh(u32);
    memcpy(&u32, in + 36, 4), f->msg_len = le32toh(u32);
}

#endif
