use std::process::ExitCode;

use clap::Parser;
use qpwatch::{
    export::http::web_config,
    service::config::{self, Cli, Command, RunArgs},
    service::daemon::{self, Mode},
};

/// Exit code for bad configuration or flags (clap uses 2 for usage errors too).
const BAD_CONFIG: u8 = 2;

fn main() -> ExitCode {
    let cli = Cli::parse();
    match cli.command {
        None => serve(cli.run, Mode::Serve),
        Some(Command::Run(args)) => serve(args, Mode::Serve),
        Some(Command::Events(args)) => serve(args, Mode::Events),
        Some(Command::CheckConfig { path, config }) => {
            check_config(&path.or(config).expect("clap requires one"))
        }
        Some(Command::Probe(args)) => {
            let _ = qpwatch::service::logging::init("warn", config::LogFormat::Text);
            match qpwatch::synthetic::prober::cli_probe(args) {
                Ok(true) => ExitCode::SUCCESS,
                Ok(false) => ExitCode::from(3),
                Err(error) => fail(&error),
            }
        }
        Some(Command::Responder(args)) => {
            let _ = qpwatch::service::logging::init("info", config::LogFormat::Text);
            match qpwatch::synthetic::prober::cli_responder(args) {
                Ok(()) => ExitCode::SUCCESS,
                Err(error) => fail(&error),
            }
        }
        Some(Command::Install(args)) => match qpwatch::service::install::install(&args.root) {
            Ok(done) => {
                done.iter().for_each(|line| println!("{line}"));
                ExitCode::SUCCESS
            }
            Err(error) => fail(&error),
        },
        Some(Command::Completions { shell }) => {
            qpwatch::service::manual::write_completions(shell, &mut std::io::stdout());
            ExitCode::SUCCESS
        }
        Some(Command::HashPassword { cost }) => {
            match qpwatch::service::password::hash_password(cost) {
                Ok(hash) => {
                    println!("{hash}");
                    ExitCode::SUCCESS
                }
                Err(error) => fail(&error),
            }
        }
        Some(Command::Manpages { dir }) => match qpwatch::service::manual::write_manpages(&dir) {
            Ok(written) => {
                written.iter().for_each(|p| println!("{}", p.display()));
                ExitCode::SUCCESS
            }
            Err(error) => fail(&error),
        },
    }
}

fn fail(error: &anyhow::Error) -> ExitCode {
    eprintln!("qpwatch: {error:#}");
    ExitCode::FAILURE
}

fn check_config(path: &std::path::Path) -> ExitCode {
    let text = match config::read_file(path) {
        Ok(text) => text,
        Err(error) => {
            eprintln!("qpwatch: {error}");
            return ExitCode::from(BAD_CONFIG);
        }
    };
    match config::parse_file(path, &text) {
        Ok(settings) => {
            let web = match web_config::load(settings.web_config_file.as_deref()) {
                Ok(web) => match &settings.web_config_file {
                    Some(file) => format!(", web config {}: {}", file.display(), web.summary()),
                    None => String::new(),
                },
                Err(error) => {
                    eprintln!("qpwatch: {error}");
                    return ExitCode::from(BAD_CONFIG);
                }
            };
            let fleet = match &settings.mesh {
                None => String::new(),
                Some(mesh) => format!(
                    ", fleet mode: UD responder {}, targets file {}",
                    mesh.listen.map_or("off".to_owned(), |a| a.to_string()),
                    mesh.targets_file
                        .as_ref()
                        .map_or("none".to_owned(), |p| p.display().to_string())
                ),
            };
            println!(
                "{}: ok ({} probe targets, responder {}{fleet}{web})",
                path.display(),
                settings.targets.len(),
                settings
                    .responder_listen
                    .map_or("off".to_owned(), |a| a.to_string())
            );
            ExitCode::SUCCESS
        }
        Err(error) => {
            eprintln!("qpwatch: {error}");
            ExitCode::from(BAD_CONFIG)
        }
    }
}

fn serve(args: RunArgs, mode: Mode) -> ExitCode {
    let settings = match config::load(&args) {
        Ok(settings) => settings,
        Err(error) => {
            eprintln!("qpwatch: {error}");
            return ExitCode::from(BAD_CONFIG);
        }
    };
    let web = match mode {
        Mode::Serve => match web_config::load(settings.web_config_file.as_deref()) {
            Ok(web) => web,
            Err(error) => {
                eprintln!("qpwatch: {error}");
                return ExitCode::from(BAD_CONFIG);
            }
        },
        Mode::Events => web_config::WebConfig::default(),
    };
    if let Err(error) = qpwatch::service::logging::init(&settings.log_level, settings.log_format) {
        return fail(&error);
    }
    let runtime = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .thread_name(qpwatch::service::daemon::BLOCKING_THREAD_NAME)
        .build()
    {
        Ok(runtime) => runtime,
        Err(error) => return fail(&error.into()),
    };
    match runtime.block_on(daemon::run(settings, web, args, mode)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(error) => {
            tracing::error!("{error:#}");
            fail(&error)
        }
    }
}
