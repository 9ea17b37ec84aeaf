//! `#[sharded_timer::main]` in a crate whose only dependency is `sharded-timer`.

use sharded_timer::time::{self, Duration, Instant};

#[sharded_timer::main(flavor = "current_thread", start_paused = true)]
async fn main() {
    let start = Instant::now();
    time::sleep(Duration::from_secs(3600)).await;
    assert_eq!(start.elapsed(), Duration::from_secs(3600));
    println!("slept an hour of paused time");
}
