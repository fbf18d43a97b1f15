//! HTTP/1.1 with JSON bodies over a Unix socket: the one way the processes
//! talk (command → `api.sock`, daemon → `proxy/proxy.sock`, load balancer →
//! `api.sock`).

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::{Method, Request, StatusCode};
use std::path::Path;
use std::time::Duration;

/// Sends one request and reads the whole answer, within `timeout`.
pub async fn request(
    sock: &Path,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let fut = async {
        let stream = tokio::net::UnixStream::connect(sock).await?;
        let io = hyper_util::rt::TokioIo::new(stream);
        let (mut sender, conn) = hyper::client::conn::http1::handshake(io).await?;
        tokio::spawn(async move {
            let _ = conn.await;
        });
        let req = Request::builder()
            .method(method)
            .uri(path)
            .header("host", "shinyctl")
            .header("content-type", "application/json")
            .body(Full::new(Bytes::from(body.unwrap_or_default())))?;
        let resp = sender.send_request(req).await?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        anyhow::Ok((status, bytes))
    };
    match tokio::time::timeout(timeout, fut).await {
        Ok(r) => r,
        Err(_) => anyhow::bail!("{} did not answer within {:?}", sock.display(), timeout),
    }
}

/// Like [`request`], from code that is not async (the command): runs it on
/// a small runtime of its own.
pub fn request_blocking(
    sock: &Path,
    method: Method,
    path: &str,
    body: Option<Vec<u8>>,
    timeout: Duration,
) -> anyhow::Result<(StatusCode, Bytes)> {
    let rt = tokio::runtime::Builder::new_current_thread().enable_all().build()?;
    rt.block_on(request(sock, method, path, body, timeout))
}

/// A JSON response with the given status.
pub fn json_response<T: serde::Serialize>(status: StatusCode, value: &T) -> hyper::Response<Full<Bytes>> {
    let body = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    hyper::Response::builder()
        .status(status)
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .unwrap_or_else(|_| hyper::Response::new(Full::new(Bytes::new())))
}

/// Serves HTTP/1.1 on a bound Unix listener, one task per connection, until
/// the task is dropped.
pub async fn serve<F, Fut>(listener: tokio::net::UnixListener, handler: F)
where
    F: Fn(Request<hyper::body::Incoming>) -> Fut + Clone + Send + Sync + 'static,
    Fut: std::future::Future<Output = hyper::Response<Full<Bytes>>> + Send + 'static,
{
    loop {
        let Ok((stream, _)) = listener.accept().await else {
            tokio::time::sleep(Duration::from_millis(50)).await;
            continue;
        };
        let handler = handler.clone();
        tokio::spawn(async move {
            let io = hyper_util::rt::TokioIo::new(stream);
            let svc = hyper::service::service_fn(move |req| {
                let handler = handler.clone();
                async move { Ok::<_, std::convert::Infallible>(handler(req).await) }
            });
            let _ = hyper::server::conn::http1::Builder::new().serve_connection(io, svc).await;
        });
    }
}

/// Reads a whole request body, refusing more than `limit` bytes.
pub async fn read_body(body: hyper::body::Incoming, limit: usize) -> anyhow::Result<Bytes> {
    let limited = http_body_util::Limited::new(body, limit);
    match limited.collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) => anyhow::bail!("request body: {e}"),
    }
}
