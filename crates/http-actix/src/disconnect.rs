//! Noticing that a client has gone while its query runs.
//!
//! actix-web keeps polling a handler after its client disconnects (actix/actix-web#3462), so a long query would
//! run to its end for nobody, holding one of its project's slots. Each connection keeps a duplicate of its socket
//! (taken when the connection opens); a run watches it and is dropped, which cancels the query, once the peer has
//! closed. A client that half-closes its side while still reading counts as gone: HTTP clients do not do that.

use std::any::Any;
use std::future::Future;
use std::mem::MaybeUninit;
use std::sync::Arc;
use std::time::Duration;

use actix_web::dev::Extensions;
use actix_web::HttpRequest;
use socket2::{SockRef, Socket};

/// How often a running query checks its client.
const CHECK_EVERY: Duration = Duration::from_millis(100);

/// The client's socket, shared with the connection (a duplicated descriptor).
#[derive(Clone)]
pub(crate) struct ClientSocket(Arc<Socket>);

/// `HttpServer::on_connect` hook: keeps a handle on each TCP connection's socket.
pub fn on_connect(connection: &dyn Any, extensions: &mut Extensions) {
    if let Some(stream) = connection.downcast_ref::<actix_web::rt::net::TcpStream>() {
        if let Ok(socket) = SockRef::from(stream).try_clone() {
            extensions.insert(ClientSocket(Arc::new(socket)));
        }
    }
}

/// Whether the peer has closed: a peek that reads end-of-stream (or fails) means gone; no data yet means here.
fn closed(socket: &Socket) -> bool {
    let mut byte = [MaybeUninit::<u8>::uninit(); 1];
    match socket.peek(&mut byte) {
        Ok(0) => true,
        Ok(_) => false,
        Err(err) => !matches!(err.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::Interrupted),
    }
}

async fn gone(socket: ClientSocket) {
    loop {
        actix_web::rt::time::sleep(CHECK_EVERY).await;
        if closed(&socket.0) {
            return;
        }
    }
}

/// Runs `work` unless the client disconnects first; then `work` is dropped and `None` returned. Work that is
/// done at its first poll (a cached run) never starts the watch.
pub(crate) async fn unless_disconnected<T>(req: &HttpRequest, work: impl Future<Output = T>) -> Option<T> {
    let mut work = std::pin::pin!(work);
    let first = std::future::poll_fn(|cx| std::task::Poll::Ready(work.as_mut().poll(cx))).await;
    if let std::task::Poll::Ready(result) = first {
        return Some(result);
    }
    let Some(socket) = req.conn_data::<ClientSocket>().cloned() else {
        return Some(work.await);
    };
    tokio::select! {
        result = work => Some(result),
        () = gone(socket) => None,
    }
}
