//! The `cleave` command line (DESIGN §7.2).
//!
//! Exit codes: 0 success, 1 user error (bad input, tolerance exceeded), 2 internal error.
//! A panic is always an internal error: the hook prints one line and exits 2, never a backtrace.

#![allow(clippy::print_stdout, clippy::print_stderr)]

mod cli;

fn main() {
    std::panic::set_hook(Box::new(|info| {
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_else(|| "unknown panic".into());
        // A closed pipe (`cleave explain .. | head`) is the reader's choice, not our failure.
        if msg.contains("Broken pipe") {
            std::process::exit(0);
        }
        let at = info.location().map(|l| format!(" at {}:{}", l.file(), l.line())).unwrap_or_default();
        eprintln!("cleave: internal error: {msg}{at}");
        std::process::exit(2);
    }));
    let args: Vec<String> = std::env::args().skip(1).collect();
    std::process::exit(cli::run(&args));
}
