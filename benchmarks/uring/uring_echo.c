/* A lumenrt TCP frame responder on io_uring (liburing): the measured prototype of issue 18's
 * io_uring question, not production code. For every request frame (docs/tcp-protocol.md: a 24-byte
 * header, then metadata and payload) it writes back one canned response frame, read from a file
 * at start, carrying the request's id. uvloop_echo.py does the same on uvloop; uring_compare.py
 * runs both under the same idle crowd and load.
 *
 *   uring_echo RESPONSE_FILE    listens on 127.0.0.1, any free port; prints the port, then serves
 *                               until SIGTERM/SIGINT
 *
 * io_uring use: one ring; one multishot accept; per connection one multishot recv that takes its
 * buffer from a provided-buffer ring shared by every connection (an idle connection holds no
 * receive buffer: the same property as lumenrt's TCP front end, tcp_receiver.py); one send per recv
 * completion, carrying the answers to the frames that completion finished.
 *
 * Invariants
 *   1. One thread: the ring, the connections and the buffer ring are touched by main only.
 *   2. A provided buffer goes back to the buffer ring as soon as its bytes are parsed: a frame's
 *      bytes are never kept (a connection keeps only a split header, 24 bytes, and how many body
 *      bytes are still to skip).
 *   3. Buffers: a send's bytes are owned by its struct op (user_data) from submission to its CQE,
 *      which frees them (a short send is resubmitted for the rest first). A connection is freed by
 *      the completion that finds it closed (recv ended) with no send in flight.
 *   4. A multishot request that ends (no IORING_CQE_F_MORE) is armed again unless its connection
 *      closed (ENOBUFS: the buffer ring ran dry for a moment).
 *
 * Shutdown: a signal stops the loop between completions; the process exits and the kernel closes
 * every socket and the ring (a prototype: nothing is drained).
 */
#include <errno.h>
#include <liburing.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#define LRT_HEADER_BYTES 24
#define LRT_ID_AT 8
#define LRT_META_AT 16
#define LRT_PAYLOAD_AT 20
#define RING_ENTRIES 4096  /* guessed: far more than one loop iteration submits */
#define BUF_COUNT 1024     /* provided receive buffers, shared by all connections (guessed) */
#define BUF_BYTES 4096     /* each: a small request frame is ~300 bytes (digits_mlp batch 1) */
#define BUF_GROUP 1

_Static_assert((BUF_COUNT & (BUF_COUNT - 1)) == 0, "a buffer ring's size is a power of two");

enum op_kind { OP_ACCEPT, OP_RECV, OP_SEND };

struct op {
    enum op_kind kind;
    struct conn *conn;
    char *data; /* OP_SEND: the answers, owned by this op (invariant 3) */
    size_t len, off;
};

struct conn {
    int fd;
    int closed;          /* its recv ended: freed once no send is in flight */
    int sends;           /* sends in flight */
    unsigned char head[LRT_HEADER_BYTES];
    size_t head_have;    /* bytes of a header received so far */
    uint64_t skip;       /* body bytes of the current frame still to come */
    uint64_t id;         /* the current frame's request id */
    struct op recv;      /* the multishot recv's user_data */
};

static struct io_uring ring;
static struct io_uring_buf_ring *bufs;
static char *buf_memory;
static unsigned char *response;
static size_t response_len;
static struct op accept_op = {.kind = OP_ACCEPT};
static int listen_fd;
static volatile sig_atomic_t stopping;

static void on_signal(int sig) {
    (void)sig;
    stopping = 1;
}

static struct io_uring_sqe *get_sqe(void) {
    struct io_uring_sqe *sqe = io_uring_get_sqe(&ring);
    if (sqe == NULL) { /* the SQ is full: submit what is there to make room */
        io_uring_submit(&ring);
        sqe = io_uring_get_sqe(&ring);
    }
    if (sqe == NULL) {
        fprintf(stderr, "uring_echo: no submission queue entry\n");
        exit(1);
    }
    return sqe;
}

static void arm_accept(void) {
    struct io_uring_sqe *sqe = get_sqe();
    io_uring_prep_multishot_accept(sqe, listen_fd, NULL, NULL, 0);
    io_uring_sqe_set_data(sqe, &accept_op);
}

static void arm_recv(struct conn *c) {
    struct io_uring_sqe *sqe = get_sqe();
    io_uring_prep_recv_multishot(sqe, c->fd, NULL, 0, 0);
    sqe->flags |= IOSQE_BUFFER_SELECT;
    sqe->buf_group = BUF_GROUP;
    io_uring_sqe_set_data(sqe, &c->recv);
}

static void submit_send(struct op *op) {
    struct io_uring_sqe *sqe = get_sqe();
    io_uring_prep_send(sqe, op->conn->fd, op->data + op->off, op->len - op->off, MSG_NOSIGNAL);
    io_uring_sqe_set_data(sqe, op);
}

static void maybe_free(struct conn *c) {
    if (c->closed && c->sends == 0) {
        close(c->fd);
        free(c);
    }
}

static uint32_t u32_at(const unsigned char *p) {
    uint32_t v;
    memcpy(&v, p, sizeof v); /* little-endian host (x86-64, arm64) */
    return v;
}

/* Parse n received bytes; append an answer for every frame they finish to *out (grown as needed). */
static void parse(struct conn *c, const unsigned char *p, size_t n, char **out, size_t *out_len, size_t *out_cap) {
    while (n > 0) {
        if (c->skip == 0 && c->head_have < LRT_HEADER_BYTES) {
            size_t k = LRT_HEADER_BYTES - c->head_have;
            if (k > n) k = n;
            memcpy(c->head + c->head_have, p, k);
            c->head_have += k;
            p += k;
            n -= k;
            if (c->head_have < LRT_HEADER_BYTES) return;
            memcpy(&c->id, c->head + LRT_ID_AT, sizeof c->id);
            c->skip = (uint64_t)u32_at(c->head + LRT_META_AT) + u32_at(c->head + LRT_PAYLOAD_AT);
        } else {
            size_t k = c->skip < n ? (size_t)c->skip : n;
            c->skip -= k;
            p += k;
            n -= k;
        }
        if (c->skip == 0 && c->head_have == LRT_HEADER_BYTES) { /* a whole frame: answer it */
            c->head_have = 0;
            if (*out_len + response_len > *out_cap) {
                *out_cap = 2 * (*out_cap + response_len);
                *out = realloc(*out, *out_cap);
                if (*out == NULL) {
                    perror("uring_echo: realloc");
                    exit(1);
                }
            }
            memcpy(*out + *out_len, response, response_len);
            memcpy(*out + *out_len + LRT_ID_AT, &c->id, sizeof c->id);
            *out_len += response_len;
        }
    }
}

static void on_recv(struct conn *c, struct io_uring_cqe *cqe) {
    int more = cqe->flags & IORING_CQE_F_MORE;
    if (cqe->res > 0 && (cqe->flags & IORING_CQE_F_BUFFER)) {
        unsigned bid = cqe->flags >> IORING_CQE_BUFFER_SHIFT;
        char *buf = buf_memory + (size_t)bid * BUF_BYTES;
        char *out = NULL;
        size_t out_len = 0, out_cap = 0;
        parse(c, (const unsigned char *)buf, (size_t)cqe->res, &out, &out_len, &out_cap);
        io_uring_buf_ring_add(bufs, buf, BUF_BYTES, bid, io_uring_buf_ring_mask(BUF_COUNT), 0);
        io_uring_buf_ring_advance(bufs, 1); /* invariant 2 */
        if (out_len > 0) {
            struct op *op = calloc(1, sizeof *op);
            if (op == NULL) {
                perror("uring_echo: calloc");
                exit(1);
            }
            *op = (struct op){.kind = OP_SEND, .conn = c, .data = out, .len = out_len};
            c->sends++;
            submit_send(op);
        }
        if (!more) arm_recv(c); /* invariant 4 */
        return;
    }
    if (cqe->res == -ENOBUFS) { /* the buffer ring ran dry: it is refilled as buffers are parsed */
        if (!more) arm_recv(c);
        return;
    }
    /* 0: the peer closed; another error: the connection is gone */
    if (!more) {
        c->closed = 1;
        maybe_free(c);
    }
}

static void on_send(struct op *op, struct io_uring_cqe *cqe) {
    struct conn *c = op->conn;
    if (cqe->res > 0 && op->off + (size_t)cqe->res < op->len) { /* short: send the rest */
        op->off += (size_t)cqe->res;
        submit_send(op);
        return;
    }
    free(op->data);
    free(op);
    c->sends--;
    maybe_free(c);
}

static void on_accept(struct io_uring_cqe *cqe) {
    if (cqe->res >= 0) {
        struct conn *c = calloc(1, sizeof *c);
        if (c == NULL) {
            perror("uring_echo: calloc");
            exit(1);
        }
        int one = 1;
        c->fd = cqe->res;
        c->recv = (struct op){.kind = OP_RECV, .conn = c};
        setsockopt(c->fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
        arm_recv(c);
    }
    if (!(cqe->flags & IORING_CQE_F_MORE)) arm_accept();
}

static void read_response(const char *path) {
    FILE *f = fopen(path, "rb");
    if (f == NULL || fseek(f, 0, SEEK_END) != 0) {
        perror(path);
        exit(2);
    }
    long size = ftell(f);
    rewind(f);
    response = malloc((size_t)size);
    if (size < LRT_HEADER_BYTES || response == NULL || fread(response, 1, (size_t)size, f) != (size_t)size) {
        fprintf(stderr, "uring_echo: %s: not a response frame\n", path);
        exit(2);
    }
    response_len = (size_t)size;
    fclose(f);
}

static void setup_buffers(void) {
    size_t ring_bytes = BUF_COUNT * sizeof(struct io_uring_buf);
    bufs = mmap(NULL, ring_bytes, PROT_READ | PROT_WRITE, MAP_ANONYMOUS | MAP_PRIVATE, -1, 0);
    buf_memory = malloc((size_t)BUF_COUNT * BUF_BYTES);
    if (bufs == MAP_FAILED || buf_memory == NULL) {
        perror("uring_echo: buffers");
        exit(1);
    }
    struct io_uring_buf_reg reg = {.ring_addr = (unsigned long)bufs, .ring_entries = BUF_COUNT, .bgid = BUF_GROUP};
    int rc = io_uring_register_buf_ring(&ring, &reg, 0);
    if (rc < 0) {
        fprintf(stderr, "uring_echo: io_uring_register_buf_ring: %s\n", strerror(-rc));
        exit(3);
    }
    io_uring_buf_ring_init(bufs);
    for (unsigned i = 0; i < BUF_COUNT; i++) {
        io_uring_buf_ring_add(bufs, buf_memory + (size_t)i * BUF_BYTES, BUF_BYTES, (unsigned short)i,
                              io_uring_buf_ring_mask(BUF_COUNT), (int)i);
    }
    io_uring_buf_ring_advance(bufs, BUF_COUNT);
}

static void listen_on_loopback(void) {
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof addr;
    int one = 1;
    listen_fd = socket(AF_INET, SOCK_STREAM, 0);
    if (listen_fd < 0 || setsockopt(listen_fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one) < 0 ||
        bind(listen_fd, (struct sockaddr *)&addr, sizeof addr) < 0 || listen(listen_fd, 1024) < 0 ||
        getsockname(listen_fd, (struct sockaddr *)&addr, &len) < 0) {
        perror("uring_echo: listen");
        exit(1);
    }
    printf("%d\n", ntohs(addr.sin_port));
    fflush(stdout);
}

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: uring_echo RESPONSE_FILE\n");
        return 2;
    }
    read_response(argv[1]);
    int rc = io_uring_queue_init(RING_ENTRIES, &ring, 0);
    if (rc < 0) { /* EPERM: io_uring disabled (kernel.io_uring_disabled, seccomp); ENOSYS: no io_uring */
        fprintf(stderr, "uring_echo: io_uring_setup: %s\n", strerror(-rc));
        return 3;
    }
    setup_buffers();
    listen_on_loopback();
    signal(SIGTERM, on_signal);
    signal(SIGINT, on_signal);
    arm_accept();
    while (!stopping) {
        struct io_uring_cqe *cqe;
        rc = io_uring_submit_and_wait(&ring, 1);
        if (rc < 0 && rc != -EINTR) {
            fprintf(stderr, "uring_echo: io_uring_submit_and_wait: %s\n", strerror(-rc));
            return 1;
        }
        unsigned head, seen = 0;
        io_uring_for_each_cqe(&ring, head, cqe) {
            struct op *op = io_uring_cqe_get_data(cqe);
            seen++;
            if (op == NULL) continue;
            switch (op->kind) {
            case OP_ACCEPT: on_accept(cqe); break;
            case OP_RECV: on_recv(op->conn, cqe); break;
            case OP_SEND: on_send(op, cqe); break;
            }
        }
        io_uring_cq_advance(&ring, seen);
    }
    return 0;
}
