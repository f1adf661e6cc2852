use clap::Parser;
use qpwatch::config::{Cli, Command};

fn main() -> std::process::ExitCode {
    let cli = Cli::parse();
    let (args, mode) = match cli.command {
        Some(Command::Run(args)) => (args, qpwatch::daemon::Mode::Serve),
        Some(Command::Events(args)) => (args, qpwatch::daemon::Mode::Events),
        None => (cli.run, qpwatch::daemon::Mode::Serve),
    };
    if let Err(error) = qpwatch::logging::init(&args.log_level, args.log_format) {
        eprintln!("qpwatch: {error:#}");
        return std::process::ExitCode::from(2);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => {
            eprintln!("qpwatch: cannot start the async runtime: {error}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(qpwatch::daemon::run(args, mode)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            eprintln!("qpwatch: {error:#}");
            std::process::ExitCode::FAILURE
        }
    }
}
