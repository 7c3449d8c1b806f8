//! actix-web with its defaults (one acceptor thread, `--workers N` worker threads), serving the
//! axum app's routes: `GET /` the same hello page, `GET /cpu` the CPU the handler runs on.

use actix_web::{get, App, HttpResponse, HttpServer};

const HELLO: &str = "<!doctype html>\n<html><head><title>corelocal-tokio</title></head>\
<body><h1>Hello from corelocal-tokio</h1><p>GET /cpu answers the CPU that served the request.</p>\
</body></html>\n";

#[get("/")]
async fn hello() -> HttpResponse {
    HttpResponse::Ok()
        .content_type("text/html; charset=utf-8")
        .body(HELLO)
}

#[get("/cpu")]
async fn cpu() -> String {
    // SAFETY: sched_getcpu has no preconditions.
    let c = unsafe { libc::sched_getcpu() };
    format!("{c}\n")
}

fn main() -> std::io::Result<()> {
    let mut listen = "127.0.0.1:8080".to_string();
    let mut workers = 2usize;
    let mut it = std::env::args().skip(1);
    while let Some(flag) = it.next() {
        match (flag.as_str(), it.next()) {
            ("--listen", Some(v)) => listen = v,
            ("--workers", Some(v)) => workers = v.parse().expect("--workers N"),
            _ => {
                eprintln!("usage: actix-peer [--listen ADDR] [--workers N]");
                std::process::exit(2);
            }
        }
    }
    actix_web::rt::System::new().block_on(async move {
        HttpServer::new(|| App::new().service(hello).service(cpu))
            .workers(workers)
            .bind(&listen)?
            .run()
            .await
    })
}
