//! Records what built the driver, for its reports: `rustc -V` and the commit.

use std::process::Command;

/// The first line a command printed, or `unknown` if it could not run.
fn first_line(program: &str, args: &[&str]) -> String {
    Command::new(program)
        .args(args)
        .output()
        .ok()
        .filter(|out| out.status.success())
        .and_then(|out| String::from_utf8(out.stdout).ok())
        .and_then(|text| text.lines().next().map(str::to_owned))
        .unwrap_or_else(|| "unknown".to_owned())
}

fn main() {
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".to_owned());
    println!(
        "cargo:rustc-env=DRIVER_RUSTC_VERSION={}",
        first_line(&rustc, &["-V"])
    );
    println!(
        "cargo:rustc-env=DRIVER_COMMIT={}",
        first_line("git", &["describe", "--always", "--dirty"])
    );
    // Re-run when the checked-out commit moves.
    for path in ["../.git/HEAD", "../.git/index"] {
        if std::path::Path::new(path).exists() {
            println!("cargo:rerun-if-changed={path}");
        }
    }
}
