/* Loaded into a benchmark's client processes (LD_PRELOAD) by bench/srcaddr.py: each TCP
 * socket of the process gets the next of SHINGLE_BENCH_SOURCES source addresses, 127.0.0.1
 * upwards, in turn, when it connects to a loopback address unbound or binds to 0.0.0.0 (nfs-rs
 * binds every socket to 0.0.0.0 first). `shingle serve --heads N` picks a client's head by its
 * address (docs/heads.md), and clients such as nfs-rs cannot be told which source address to
 * use: on one machine every connection would come from 127.0.0.1 and reach one head. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <sys/socket.h>

typedef int (*sockfn)(int, const struct sockaddr *, socklen_t);

static atomic_uint turn;

/* The number of source addresses when ``fd`` is a TCP socket, else 0. */
static unsigned sources(int fd)
{
    const char *env = getenv("SHINGLE_BENCH_SOURCES");
    unsigned count = env ? (unsigned)strtoul(env, NULL, 10) : 0;
    int type = 0;
    socklen_t tlen = sizeof type;
    if (count < 2 || getsockopt(fd, SOL_SOCKET, SO_TYPE, &type, &tlen) != 0 || type != SOCK_STREAM)
        return 0;
    return count;
}

static in_addr_t next_source(unsigned count)
{
    return htonl(0x7f000001u + atomic_fetch_add(&turn, 1) % count);
}

int bind(int fd, const struct sockaddr *addr, socklen_t len)
{
    static sockfn real_bind;
    if (real_bind == NULL)
        real_bind = (sockfn)dlsym(RTLD_NEXT, "bind");
    if (addr != NULL && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)
        && ((const struct sockaddr_in *)addr)->sin_addr.s_addr == htonl(INADDR_ANY)) {
        unsigned count = sources(fd);
        if (count) {
            struct sockaddr_in from = *(const struct sockaddr_in *)addr;
            from.sin_addr.s_addr = next_source(count);
            return real_bind(fd, (const struct sockaddr *)&from, sizeof from);
        }
    }
    return real_bind(fd, addr, len);
}

int connect(int fd, const struct sockaddr *addr, socklen_t len)
{
    static sockfn real_connect;
    if (real_connect == NULL)
        real_connect = (sockfn)dlsym(RTLD_NEXT, "connect");
    if (addr != NULL && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)
        && (ntohl(((const struct sockaddr_in *)addr)->sin_addr.s_addr) >> 24) == 127) {
        struct sockaddr_in bound;
        socklen_t blen = sizeof bound;
        unsigned count = sources(fd);
        /* a socket bound already (by bind above, or to a reserved port) keeps its address */
        if (count && getsockname(fd, (struct sockaddr *)&bound, &blen) == 0
            && bound.sin_family == AF_INET && bound.sin_port == 0) {
            struct sockaddr_in from = {0};
            from.sin_family = AF_INET;
            from.sin_addr.s_addr = next_source(count);
            (void)bind(fd, (const struct sockaddr *)&from, sizeof from);
        }
    }
    return real_connect(fd, addr, len);
}
