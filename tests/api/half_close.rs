//! A client that closes its side of the connection while its request is in progress is gone
//! (the server turns half-closures off, `startup`): its request is dropped, never answered,
//! even when the answer becomes ready in the very poll in which the close is read. For a
//! waiting acquisition that answer is a lease, and one written to a client that left is a
//! grant nobody received (`vendor/README.md`, change 4). Tested on the HTTP layer alone, with
//! a handler whose answer is ready without waking its connection, so that only the close can.

use std::io::{Read, Write};
use std::net::{Shutdown, TcpStream};
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc;
use std::task::Poll;
use std::time::Duration;

use actix_web::{App, HttpResponse, HttpServer, web};

/// The test's hold on the handler: `entered` when it runs, `ready` to let it answer.
#[derive(Clone)]
struct Handler {
    entered: mpsc::SyncSender<()>,
    ready: Arc<AtomicBool>,
}

/// Answers once `ready` is set, as seen whenever its connection polls it: setting it wakes
/// nothing, so it answers in the first poll after, whatever caused that poll.
///
/// `entered` is sent by a task of its own on the worker's thread, which runs only once the
/// connection's poll that ran this handler has ended: told from inside that poll, the test
/// could set `ready` while the dispatcher still loops in it and would see it there, before
/// the close was sent (the answer then goes out, as it should, to a client still there).
async fn answer(handler: web::Data<Handler>) -> HttpResponse {
    let entered = handler.entered.clone();
    actix_web::rt::spawn(async move {
        let _ = entered.send(());
    });
    std::future::poll_fn(|_| {
        if handler.ready.load(Ordering::SeqCst) {
            Poll::Ready(())
        } else {
            Poll::Pending
        }
    })
    .await;
    HttpResponse::Ok().body("answered")
}

#[actix_web::test]
async fn a_request_whose_client_closed_is_not_answered() {
    let (entered, entered_rx) = mpsc::sync_channel(1);
    let ready = Arc::new(AtomicBool::new(false));
    let handler = Handler {
        entered,
        ready: ready.clone(),
    };
    let server = HttpServer::new(move || {
        App::new()
            .app_data(web::Data::new(handler.clone()))
            .route("/answer", web::get().to(answer))
    })
    .workers(1)
    .disable_signals()
    .h1_allow_half_closed(false)
    .bind("127.0.0.1:0")
    .expect("bind");
    let address = server.addrs()[0];
    let server = server.run();
    let stop = server.handle();
    actix_web::rt::spawn(server);

    let received = actix_web::rt::task::spawn_blocking(move || {
        let mut client = TcpStream::connect(address).expect("connect");
        client
            .set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        client
            .write_all(b"GET /answer HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("send the request");
        entered_rx
            .recv_timeout(Duration::from_secs(10))
            .expect("the handler runs");
        // Ready, but not polled yet: the close that follows wakes the connection, and its
        // next poll both reads the close and finds the answer ready.
        ready.store(true, Ordering::SeqCst);
        client.shutdown(Shutdown::Write).expect("close our side");
        let mut received = Vec::new();
        match client.read_to_end(&mut received) {
            Ok(_) => {}
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => {}
            Err(e) => panic!("reading after the close: {e}"),
        }
        received
    })
    .await
    .expect("the client");
    stop.stop(false).await;
    assert!(
        received.is_empty(),
        "a request whose client had closed its side was answered: {:?}",
        String::from_utf8_lossy(&received)
    );
}
