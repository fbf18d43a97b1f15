//! A minimal, fast HTTP/1.1 backend for `bench/proxy.sh`: answers every
//! request with a small fixed body, so the benchmark measures the load
//! balancer in front of it rather than the app.
//!
//! `cargo run --release --example bench_backend -- <port>`

use std::convert::Infallible;

use bytes::Bytes;
use http_body_util::Full;
use hyper::{Request, Response};
use hyper_util::rt::TokioIo;

const BODY: &[u8] = b"Hello from the benchmark backend\n";

fn main() -> std::io::Result<()> {
    let port: u16 = std::env::args().nth(1).and_then(|p| p.parse().ok()).unwrap_or(20999);
    let rt = tokio::runtime::Builder::new_multi_thread().worker_threads(1).enable_all().build()?;
    rt.block_on(async move {
        let listener = tokio::net::TcpListener::bind(("127.0.0.1", port)).await?;
        loop {
            let (stream, _) = listener.accept().await?;
            let _ = stream.set_nodelay(true);
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<hyper::body::Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(BODY))))
                });
                let _ = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc).await;
            });
        }
    })
}
