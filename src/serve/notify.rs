//! systemd's readiness notification (`Type=notify`): a datagram such as
//! `READY=1` to the Unix socket named by `NOTIFY_SOCKET` (a path, or an
//! abstract name written with a leading `@`). A few lines of std, no crate.

use std::ffi::OsString;
use std::os::unix::ffi::OsStrExt;
use std::os::unix::net::UnixDatagram;

/// The variable systemd sets for a `Type=notify` service.
pub const NOTIFY_ENV: &str = "NOTIFY_SOCKET";

/// Takes `NOTIFY_SOCKET` out of the environment, so no child (the load
/// balancer, a copy) inherits it, and returns it. Call it while the process
/// has one thread.
pub fn take_socket() -> Option<OsString> {
    let socket = std::env::var_os(NOTIFY_ENV).filter(|s| !s.is_empty());
    std::env::remove_var(NOTIFY_ENV);
    socket
}

/// Sends `message` (such as `READY=1`) to the notify socket.
pub fn send(socket: &OsString, message: &str) -> std::io::Result<()> {
    let sock = UnixDatagram::unbound()?;
    let bytes = socket.as_bytes();
    if let Some(name) = bytes.strip_prefix(b"@") {
        use std::os::linux::net::SocketAddrExt;
        let addr = std::os::unix::net::SocketAddr::from_abstract_name(name)?;
        sock.send_to_addr(message.as_bytes(), &addr)?;
    } else {
        sock.send_to(message.as_bytes(), std::path::Path::new(socket))?;
    }
    Ok(())
}

/// Tells systemd the daemon is ready once its API answers `status` (within
/// 30 s; later than that, systemd has given up anyway).
pub async fn ready_when_answering(socket: OsString, api_sock: std::path::PathBuf) {
    let deadline = tokio::time::Instant::now() + std::time::Duration::from_secs(30);
    let status = crate::wire::api_client::routes::status(None);
    loop {
        let answered = crate::wire::uds::request(&api_sock, hyper::Method::GET, &status, None, std::time::Duration::from_secs(2)).await;
        if answered.is_ok_and(|(code, _)| code.is_success()) {
            break;
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::error!("the API did not answer within 30 s; not telling systemd it is ready");
            return;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }
    match send(&socket, "READY=1") {
        Ok(()) => tracing::info!("told systemd the daemon is ready"),
        Err(e) => tracing::error!("cannot tell systemd the daemon is ready ({NOTIFY_ENV}={socket:?}): {e}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ready_reaches_a_socket_by_path_and_by_abstract_name() {
        let temp = tempfile::tempdir().unwrap();
        let dir = temp.path();
        let path = dir.join("notify.sock");
        let listener = UnixDatagram::bind(&path).unwrap();
        send(&OsString::from(path.as_os_str()), "READY=1").unwrap();
        let mut buf = [0u8; 64];
        let n = listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");

        use std::os::linux::net::SocketAddrExt;
        let name = format!("shinyctl-notify-test-{}", std::process::id());
        let abstract_listener =
            UnixDatagram::bind_addr(&std::os::unix::net::SocketAddr::from_abstract_name(name.as_bytes()).unwrap()).unwrap();
        send(&OsString::from(format!("@{name}")), "READY=1").unwrap();
        let n = abstract_listener.recv(&mut buf).unwrap();
        assert_eq!(&buf[..n], b"READY=1");
    }
}
