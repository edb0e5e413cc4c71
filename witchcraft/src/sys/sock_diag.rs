//! Who owns the other end of a local TCP connection: the kernel's socket
//! diagnostics (`NETLINK_SOCK_DIAG`, one exact lookup by the connection's
//! four addresses and ports, the way `ss` asks).
//!
//! A TCP connection carries no credentials, but when both ends are on this
//! host the client's socket is one the kernel keeps, with the uid of the
//! process that made it. Only a connection still established is answered:
//! a client that has closed its end leaves a socket in `TIME_WAIT` (or an
//! orphan on its way there), which the kernel reports as uid 0.

use std::net::{IpAddr, SocketAddr};
use std::os::fd::{AsRawFd, FromRawFd, OwnedFd};

const SOCK_DIAG_BY_FAMILY: u16 = 20;
const TCP_ESTABLISHED: u8 = 1;
/// The cookie that matches any socket.
const NO_COOKIE: u32 = !0;

#[repr(C)]
#[derive(Clone, Copy, Default)]
struct NlMsgHdr {
    len: u32,
    kind: u16,
    flags: u16,
    seq: u32,
    pid: u32,
}

/// `struct inet_diag_sockid`: ports and addresses in network order.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct SockId {
    sport: u16,
    dport: u16,
    src: [u32; 4],
    dst: [u32; 4],
    interface: u32,
    cookie: [u32; 2],
}

/// `struct inet_diag_req_v2`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InetDiagReq {
    hdr: NlMsgHdr,
    family: u8,
    protocol: u8,
    ext: u8,
    pad: u8,
    states: u32,
    id: SockId,
}

/// `struct inet_diag_msg`.
#[repr(C)]
#[derive(Clone, Copy, Default)]
struct InetDiagMsg {
    family: u8,
    state: u8,
    timer: u8,
    retrans: u8,
    id: SockId,
    expires: u32,
    rqueue: u32,
    wqueue: u32,
    uid: u32,
    inode: u32,
}

fn words(ip: IpAddr) -> [u32; 4] {
    let mut w = [0u32; 4];
    let b: Vec<u8> = match ip {
        IpAddr::V4(a) => a.octets().to_vec(),
        IpAddr::V6(a) => a.octets().to_vec(),
    };
    for (i, c) in b.chunks(4).enumerate() {
        w[i] = u32::from_ne_bytes([c[0], c[1], c[2], c[3]]);
    }
    w
}

/// The uid owning the socket at `peer` that is connected to `local` (an
/// accepted connection's two ends, both on this host). None when the kernel
/// knows no such established connection, or cannot be asked.
pub fn tcp_peer_uid(local: SocketAddr, peer: SocketAddr) -> Option<u32> {
    let family = match (local, peer) {
        (SocketAddr::V4(_), SocketAddr::V4(_)) => libc::AF_INET,
        (SocketAddr::V6(_), SocketAddr::V6(_)) => libc::AF_INET6,
        _ => return None,
    };
    // SAFETY: a plain socket call; the descriptor is owned from here.
    let fd = unsafe {
        libc::socket(libc::AF_NETLINK, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 4 /* NETLINK_SOCK_DIAG */)
    };
    if fd < 0 {
        return None;
    }
    // SAFETY: fd was just returned by socket() and is ours alone.
    let sock = unsafe { OwnedFd::from_raw_fd(fd) };
    let tv = libc::timeval { tv_sec: 1, tv_usec: 0 };
    // SAFETY: SO_RCVTIMEO takes a timeval of this size.
    unsafe {
        libc::setsockopt(fd, libc::SOL_SOCKET, libc::SO_RCVTIMEO, (&tv as *const libc::timeval).cast(), size_of::<libc::timeval>() as u32)
    };
    // The client's socket, as it sees itself: its own address is our peer.
    let req = InetDiagReq {
        hdr: NlMsgHdr {
            len: size_of::<InetDiagReq>() as u32,
            kind: SOCK_DIAG_BY_FAMILY,
            flags: libc::NLM_F_REQUEST as u16,
            seq: 1,
            pid: 0,
        },
        family: family as u8,
        protocol: libc::IPPROTO_TCP as u8,
        states: 1 << TCP_ESTABLISHED,
        id: SockId {
            sport: peer.port().to_be(),
            dport: local.port().to_be(),
            src: words(peer.ip()),
            dst: words(local.ip()),
            interface: 0,
            cookie: [NO_COOKIE, NO_COOKIE],
        },
        ..Default::default()
    };
    // SAFETY: sockaddr_nl is plain data; all-zero is a valid start.
    let mut kernel: libc::sockaddr_nl = unsafe { std::mem::zeroed() };
    kernel.nl_family = libc::AF_NETLINK as u16;
    // SAFETY: sends the request struct from our stack to the kernel's address.
    let sent = unsafe {
        libc::sendto(
            sock.as_raw_fd(),
            (&req as *const InetDiagReq).cast(),
            size_of::<InetDiagReq>(),
            0,
            (&kernel as *const libc::sockaddr_nl).cast(),
            size_of::<libc::sockaddr_nl>() as u32,
        )
    };
    if sent != size_of::<InetDiagReq>() as isize {
        return None;
    }
    let mut buf = [0u64; 128];
    // SAFETY: receives at most the buffer's size into it.
    let n = unsafe { libc::recv(sock.as_raw_fd(), buf.as_mut_ptr().cast(), size_of_val(&buf), 0) };
    let hdr_len = size_of::<NlMsgHdr>();
    if n < (hdr_len + size_of::<InetDiagMsg>()) as isize {
        return None; // an error message (no such socket), or nothing
    }
    // SAFETY: the buffer holds at least a header and a message, and is 8-byte aligned.
    let (hdr, msg) = unsafe {
        let p = buf.as_ptr().cast::<u8>();
        (std::ptr::read_unaligned(p.cast::<NlMsgHdr>()), std::ptr::read_unaligned(p.add(hdr_len).cast::<InetDiagMsg>()))
    };
    let same = msg.id.sport == req.id.sport && msg.id.dport == req.id.dport && msg.id.src == req.id.src && msg.id.dst == req.id.dst;
    (hdr.kind == SOCK_DIAG_BY_FAMILY && msg.state == TCP_ESTABLISHED && msg.inode != 0 && same).then_some(msg.uid)
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::time::Duration;

    #[test]
    fn the_owner_of_a_local_connection_is_known() {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        let c = std::net::TcpStream::connect(l.local_addr().unwrap()).unwrap();
        let (s, peer) = l.accept().unwrap();
        // SAFETY: geteuid has no preconditions.
        let me = unsafe { libc::geteuid() };
        assert_eq!(tcp_peer_uid(s.local_addr().unwrap(), peer), Some(me));
        // A client that has gone is nobody's.
        drop(c);
        std::thread::sleep(Duration::from_millis(50));
        assert_eq!(tcp_peer_uid(s.local_addr().unwrap(), peer), None);
        // IPv6 loopback, where there is one.
        if let Ok(l6) = std::net::TcpListener::bind("[::1]:0") {
            let _c = std::net::TcpStream::connect(l6.local_addr().unwrap()).unwrap();
            let (s, peer) = l6.accept().unwrap();
            assert_eq!(tcp_peer_uid(s.local_addr().unwrap(), peer), Some(me));
        }
    }
}
