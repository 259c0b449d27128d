/* Preloaded into processes that run Mooncake's transfer engine (see impl/transport/mooncake.py).
 *
 * Mooncake 0.3.x binds its handshake and TCP data listeners to the wildcard address (INADDR_ANY,
 * or [::] with v6only off) and offers no setting to change it; MC_TCP_BIND_ADDRESS only changes
 * the address it advertises. Its listeners accept one-sided writes into registered memory with no
 * authentication, so a wildcard bind would let any host on the network write into decode's pages.
 * kvhandoff keeps every socket on loopback: this wrapper turns a wildcard bind into a loopback
 * bind (127.0.0.1, or ::ffff:127.0.0.1 on an IPv6 socket so IPv4 loopback peers still connect)
 * and leaves every other bind untouched. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <netinet/in.h>
#include <string.h>
#include <sys/socket.h>

typedef int (*bind_fn)(int, const struct sockaddr *, socklen_t);

int kvhandoff_loopback_bind_active = 1; /* looked up by the transport to prove it is loaded */

int bind(int fd, const struct sockaddr *addr, socklen_t len) {
    static bind_fn real_bind = 0;
    if (!real_bind) real_bind = (bind_fn)dlsym(RTLD_NEXT, "bind");
    if (addr && addr->sa_family == AF_INET && len >= (socklen_t)sizeof(struct sockaddr_in)) {
        struct sockaddr_in a;
        memcpy(&a, addr, sizeof a);
        if (a.sin_addr.s_addr == htonl(INADDR_ANY)) {
            a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    } else if (addr && addr->sa_family == AF_INET6 &&
               len >= (socklen_t)sizeof(struct sockaddr_in6)) {
        struct sockaddr_in6 a;
        memcpy(&a, addr, sizeof a);
        if (memcmp(&a.sin6_addr, &in6addr_any, sizeof a.sin6_addr) == 0) {
            static const unsigned char mapped[16] = {0, 0, 0, 0, 0, 0, 0, 0,
                                                     0, 0, 0xff, 0xff, 127, 0, 0, 1};
            memcpy(&a.sin6_addr, mapped, sizeof mapped);
            return real_bind(fd, (const struct sockaddr *)&a, sizeof a);
        }
    }
    return real_bind(fd, addr, len);
}
