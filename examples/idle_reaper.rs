//! An echo server on tokio, with sharded-timer's two async timers as a server uses
//! them: every request answered under a `timeout` (a client that stops reading cannot
//! hold the task), and every connection closed after 2 s idle through one `Sleep` per
//! connection re-armed by every message (`Sleep::reset`: in place, no allocation while
//! it is pending). The clients put each request under a `timeout` too. Clients on
//! 127.0.0.1: half send a message every 500 ms, half go quiet; after 4 s the quiet
//! ones have been closed, the busy ones not. (The driver's `net` workload is this
//! server at 10,000 connections, beside tokio's and pingora's timers.)
//!
//! Run: `cargo run --release --example idle_reaper`. Bounded: 200 connections, 4 s,
//! loopback only; it stops by itself.

use std::pin::pin;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Arc;
use std::time::Duration;

use sharded_timer::ShardedTimer;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};

const IDLE: Duration = Duration::from_secs(2);
const REQUEST_TIMEOUT: Duration = Duration::from_secs(1);
const CONNECTIONS: usize = 200;

/// Serves one connection: echoes every message, closes it after `IDLE` of silence.
async fn serve(timer: ShardedTimer, mut socket: TcpStream, closed_idle: Arc<AtomicUsize>) {
    let mut idle = pin!(timer.sleep(IDLE));
    let mut buffer = [0u8; 64];
    loop {
        tokio::select! {
            read = socket.read(&mut buffer) => match read {
                Ok(0) | Err(_) => return, // the client left
                Ok(n) => {
                    // A message: IDLE more from the service's now.
                    idle.as_mut().reset((timer.now() + IDLE).into());
                    // The answer, under a deadline: `Err` if it elapsed first.
                    match timer.timeout(REQUEST_TIMEOUT, socket.write_all(&buffer[..n])).await {
                        Ok(Ok(())) => {}
                        Ok(Err(_)) | Err(_) => return,
                    }
                }
            },
            () = &mut idle => {
                closed_idle.fetch_add(1, Ordering::SeqCst);
                return; // dropping the socket closes it
            }
        }
    }
}

/// A client: `busy` ones send a message every 500 ms for 4 s; quiet ones send one and
/// then wait. Returns whether the server closed the connection.
async fn client(timer: ShardedTimer, address: std::net::SocketAddr, busy: bool) -> bool {
    let mut socket = TcpStream::connect(address).await.expect("connects");
    let mut echo = [0u8; 4];
    for round in 0..8 {
        if round == 0 || busy {
            let request = async {
                socket.write_all(b"ping").await?;
                socket.read_exact(&mut echo).await
            };
            match timer.timeout(REQUEST_TIMEOUT, request).await {
                Ok(Ok(_)) => {}
                Ok(Err(_)) => return true, // closed by the server
                Err(elapsed) => panic!("a loopback request timed out: {elapsed}"),
            }
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    // Closed by the server: a read returns end of stream at once.
    matches!(
        tokio::time::timeout(Duration::from_millis(10), socket.read(&mut echo)).await,
        Ok(Ok(0) | Err(_))
    )
}

#[tokio::main]
async fn main() {
    let timer = ShardedTimer::new();
    let listener = TcpListener::bind("127.0.0.1:0").await.expect("binds");
    let address = listener.local_addr().expect("an address");
    let closed_idle = Arc::new(AtomicUsize::new(0));
    let server = {
        let (timer, closed_idle) = (timer.clone(), closed_idle.clone());
        tokio::spawn(async move {
            for _ in 0..CONNECTIONS {
                let (socket, _) = listener.accept().await.expect("accepts");
                tokio::spawn(serve(timer.clone(), socket, closed_idle.clone()));
            }
        })
    };
    let clients: Vec<_> = (0..CONNECTIONS)
        .map(|k| tokio::spawn(client(timer.clone(), address, k % 2 == 0)))
        .collect();
    let mut closed_busy = 0;
    let mut closed_quiet = 0;
    for (k, client) in clients.into_iter().enumerate() {
        let closed = client.await.expect("the client ran");
        match (k % 2 == 0, closed) {
            (true, true) => closed_busy += 1,
            (false, true) => closed_quiet += 1,
            _ => {}
        }
    }
    server.await.expect("the server ran");
    println!(
        "{CONNECTIONS} connections: {closed_quiet} quiet ones closed after {IDLE:?} idle, \
         {closed_busy} busy ones closed; the server counted {} idle closes",
        closed_idle.load(Ordering::SeqCst)
    );
    assert_eq!(
        closed_quiet,
        CONNECTIONS / 2,
        "every quiet connection was reaped"
    );
    assert_eq!(closed_busy, 0, "no busy connection was reaped");
}
