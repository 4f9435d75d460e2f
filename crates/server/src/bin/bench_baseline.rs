//! The baseline of `make bench`'s cached-run scenario: a minimal actix-web server that answers every request
//! with the bytes of one file (the service's own response to the same request), with no routing, no
//! authentication and no work. What the service achieves against it is the cost of everything the service does.
//!
//! `bench-baseline ADDRESS BODY_FILE WORKERS`

use actix_web::{web, App, HttpResponse, HttpServer};

#[actix_web::main]
async fn main() -> std::io::Result<()> {
    let args: Vec<String> = std::env::args().collect();
    let [_, address, body_file, workers] = args.as_slice() else {
        eprintln!("usage: bench-baseline ADDRESS BODY_FILE WORKERS");
        std::process::exit(2);
    };
    let body = web::Bytes::from(std::fs::read(body_file)?);
    let workers: usize = workers.parse().map_err(|_| std::io::Error::other("WORKERS is a number"))?;
    HttpServer::new(move || {
        let body = body.clone();
        App::new().default_service(web::to(move || {
            let body = body.clone();
            async move { HttpResponse::Ok().content_type("application/json").body(body) }
        }))
    })
    .workers(workers)
    .bind(address.as_str())?
    .run()
    .await
}
