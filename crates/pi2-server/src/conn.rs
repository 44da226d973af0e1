//! Connections: the accept loop, the cap on open connections, and the header timeout.
//!
//! Every connection holds a file descriptor and a task, so a client that opens many and sends
//! nothing could starve everyone else. Three limits keep the server answering:
//! - at most `max_connections` are served at once; one more is answered `503` and closed;
//! - a request's header must arrive within `header_timeout` of the connection opening or of the
//!   previous answer (hyper's header read timeout), so idle and half-sent connections close;
//! - the body must arrive within `body_timeout` (checked where the body is read, `routes`).

use axum::Router;
use hyper::server::conn::http1;
use hyper_util::rt::{TokioIo, TokioTimer};
use hyper_util::service::TowerToHyperService;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::AsyncWriteExt;
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::{watch, Semaphore};

/// File descriptors kept free of connections: the model file, the log, the slots' threads.
const RESERVED_FDS: u64 = 64;

/// The answer to a connection beyond the cap, written without reading the request.
const BUSY: &[u8] = b"HTTP/1.1 503 Service Unavailable\r\ncontent-type: application/json\r\nretry-after: 1\r\nconnection: close\r\ncontent-length: 115\r\n\r\n{\"error\":{\"message\":\"too many open connections; retry shortly\",\"type\":\"unavailable_error\",\"param\":null,\"code\":503}}";

/// How long a refused connection may take to receive its 503.
const BUSY_WRITE: Duration = Duration::from_secs(2);

/// Limits on connections (see the module's notes).
#[derive(Clone, Copy, Debug)]
pub struct Limits {
    pub max_connections: usize,
    pub header_timeout: Duration,
}

/// Raises this process's open-file limit to its hard limit and returns how many connections
/// fit under it: `wanted`, or fewer when the descriptors run short.
pub fn connections_that_fit(wanted: usize) -> usize {
    let mut lim = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit writes the struct it is given.
    if unsafe { libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) } != 0 {
        return wanted;
    }
    if lim.rlim_cur < lim.rlim_max {
        let raised = libc::rlimit {
            rlim_cur: lim.rlim_max,
            rlim_max: lim.rlim_max,
        };
        // SAFETY: setrlimit reads the struct; raising the soft limit to the hard one is allowed.
        if unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &raised) } == 0 {
            lim = raised;
        }
    }
    let free = lim.rlim_cur.saturating_sub(RESERVED_FDS).max(1);
    wanted.min(usize::try_from(free).unwrap_or(usize::MAX))
}

/// Serves `app` on `listener` until `stop` resolves; then stops accepting and lets open
/// connections finish their current answer.
pub async fn serve(
    listener: TcpListener,
    app: Router,
    limits: Limits,
    stop: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let permits = Arc::new(Semaphore::new(limits.max_connections));
    let (stopping, stop_rx) = watch::channel(false);
    let mut builder = http1::Builder::new();
    builder
        .timer(TokioTimer::new())
        .header_read_timeout(limits.header_timeout)
        .keep_alive(true);
    tokio::pin!(stop);
    loop {
        let stream = tokio::select! {
            _ = &mut stop => break,
            accepted = listener.accept() => match accepted {
                Ok((stream, _)) => stream,
                // Out of descriptors or a connection reset before accept: wait and go on.
                Err(_) => {
                    tokio::time::sleep(Duration::from_millis(10)).await;
                    continue;
                }
            },
        };
        let Ok(permit) = permits.clone().try_acquire_owned() else {
            tokio::spawn(refuse(stream));
            continue;
        };
        let service = TowerToHyperService::new(app.clone());
        let conn = builder.serve_connection(TokioIo::new(stream), service);
        let mut stop_rx = stop_rx.clone();
        tokio::spawn(async move {
            tokio::pin!(conn);
            let stopped = tokio::select! {
                _ = conn.as_mut() => false,
                r = stop_rx.wait_for(|s| *s) => r.is_ok(),
            };
            if stopped {
                conn.as_mut().graceful_shutdown();
                let _ = conn.await;
            }
            drop(permit);
        });
    }
    let _ = stopping.send(true);
    // Connections finish their answers (bounded: a generation ends at its token limit).
    let _ = permits
        .acquire_many(limits.max_connections as u32)
        .await
        .map(drop);
    Ok(())
}

/// Answers 503 to a connection beyond the cap without reading it, then closes it.
async fn refuse(mut stream: TcpStream) {
    let _ = tokio::time::timeout(BUSY_WRITE, async {
        stream.write_all(BUSY).await?;
        stream.shutdown().await
    })
    .await;
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_busy_answer_says_its_length() {
        let text = std::str::from_utf8(super::BUSY).unwrap();
        let (head, body) = text.split_once("\r\n\r\n").unwrap();
        assert!(head.contains(&format!("content-length: {}", body.len())));
        serde_json::from_str::<serde_json::Value>(body).unwrap();
    }
}
