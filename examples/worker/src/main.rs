//! `worker URL RESOURCE ITEM...`: processes the items under a lease on `RESOURCE`, taken
//! from the fencelock lease server at `URL` (e.g. `http://127.0.0.1:8080`).

use std::time::Duration;

use fencelock::client::Client;
use worker::Worker;

#[tokio::main]
async fn main() -> Result<(), Box<dyn std::error::Error>> {
    let mut args = std::env::args().skip(1);
    let (Some(url), Some(resource)) = (args.next(), args.next()) else {
        return Err("usage: worker URL RESOURCE ITEM...".into());
    };
    let owner = format!("worker-{}", std::process::id());
    let worker = Worker::new(Client::new(url)?, owner, Duration::from_secs(30));
    let fence = worker
        .run(&resource, args, async |fence, item: String| {
            // Here a real worker writes to the protected store, sending `fence` with it.
            println!("{resource}: {item} (fence {fence})");
        })
        .await?;
    println!("{resource}: done under fence {fence}, released");
    Ok(())
}
