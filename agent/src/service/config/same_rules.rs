//! The file and the flags reject the same bad value with the same message,
//! each naming its own key or flag: every row of the limits table, and the
//! other rules (addresses, log level, groups, buckets, targets).

use clap::CommandFactory;

use super::{
    apply_flags,
    limits::{Limit, Range, LIMITS},
    test_support::{cli, parse},
    Cli, ConfigError, Origin, Settings,
};

/// Values just outside a row's range (as text: the same for TOML and a flag).
fn bad_values(limit: &Limit) -> Vec<String> {
    match limit.range {
        Range::Integer { min, max } => vec![
            (min - 1).to_string(),
            (max + 1).to_string(),
            i64::MIN.to_string(),
        ],
        Range::PowerOfTwo { min, max } => vec![
            (min - 1).to_string(),
            (min + 1).to_string(),
            (max * 2).to_string(),
            (-min).to_string(),
            "0".into(),
        ],
        Range::Seconds { min, max } => {
            let mut values = vec!["0".into(), "-1".into(), (max + 1.0).to_string()];
            if min > 0.0 {
                values.push((min / 2.0).to_string());
            }
            values
        }
        Range::Fraction => vec!["1".into(), "-0.5".into()],
    }
}

/// The file with `key = value` in the row's section (a target's key in a
/// target of its own).
fn file_error(limit: &Limit, value: &str) -> ConfigError {
    let text = if limit.section == "targets" {
        format!(
            "[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\n{} = {value}",
            limit.key
        )
    } else {
        format!("[{}]\n{} = {value}", limit.section, limit.key)
    };
    parse(&text).expect_err(&text)
}

fn flag_error(flags: &[&str]) -> ConfigError {
    let args = cli(flags).unwrap_or_else(|e| panic!("{flags:?}: {e}"));
    apply_flags(Settings::default(), &args.run).expect_err(&format!("{flags:?}"))
}

#[test]
fn file_and_flags_reject_the_same_value_with_the_same_limit() {
    let mut compared = 0;
    for limit in LIMITS {
        let target = (limit.section == "targets").then_some(0);
        for value in bad_values(&limit) {
            let from_file = file_error(&limit, &value);
            assert_eq!(from_file.key, limit.file_key(target), "{value}");
            assert!(
                matches!(from_file.origin, Origin::File { line, .. } if line == if target.is_some() { 4 } else { 2 }),
                "{from_file}"
            );
            let Some(flag) = limit.flag else { continue };
            let from_flag = if target.is_some() {
                flag_error(&["--target", "a=198.18.0.1", flag, &value])
            } else {
                flag_error(&[flag, &value])
            };
            assert_eq!(
                (from_flag.origin.clone(), from_flag.key.as_str()),
                (Origin::Flag, flag)
            );
            assert_eq!(
                from_file.message,
                from_flag.message,
                "{} = {value} and {flag} {value}",
                limit.file_key(target)
            );
            compared += 1;
        }
    }
    assert!(compared >= 20, "{compared}");
}

/// Each message names the value and the allowed range.
#[test]
fn limit_messages_name_the_value_and_the_range() {
    for limit in LIMITS {
        let message = file_error(&limit, &bad_values(&limit)[0]).message;
        let bounds = match limit.range {
            Range::Integer { min, max } | Range::PowerOfTwo { min, max } => {
                vec![min.to_string(), max.to_string()]
            }
            Range::Seconds { min, max } if min > 0.0 => vec![min.to_string(), max.to_string()],
            Range::Seconds { max, .. } => vec![max.to_string()],
            Range::Fraction => vec!["[0, 1)".to_owned()],
        };
        assert!(message.starts_with(&bad_values(&limit)[0]), "{message}");
        for bound in bounds {
            assert!(message.contains(&bound), "{message} lacks {bound}");
        }
    }
}

/// Every flag of the table is a flag of `run`.
#[test]
fn limit_flags_are_flags() {
    let command = Cli::command();
    let run = command.find_subcommand("run").expect("run");
    for flag in LIMITS.iter().filter_map(|l| l.flag) {
        assert!(
            run.get_arguments()
                .any(|a| a.get_long() == flag.strip_prefix("--")),
            "{flag}"
        );
    }
}

#[test]
fn file_and_flags_share_the_other_rules() {
    let target = "[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\n";
    let cases: &[(&str, &str, &[&str], &str)] = &[
        ("listen = \"nonsense\"", "listen", &["--listen", "nonsense"], "--listen"),
        ("log_level = \"loud\"", "log_level", &["--log-level", "loud"], "--log-level"),
        (
            "[hooks]\ngroups = [\"qp\", \"bogus\"]",
            "hooks.groups",
            &["--groups", "qp,bogus"],
            "--groups",
        ),
        (
            "[buckets]\ndwell = [2.0, 1.0]",
            "buckets.dwell",
            &["--buckets-dwell", "2,1"],
            "--buckets-dwell",
        ),
        (
            "[buckets]\nprobe_rtt = [-1.0]",
            "buckets.probe_rtt",
            &["--buckets-probe-rtt", "-1"],
            "--buckets-probe-rtt",
        ),
        (
            "[responder]\nlisten = \"nowhere\"",
            "responder.listen",
            &["--responder-listen", "nowhere"],
            "--responder-listen",
        ),
        (
            "[[targets]]\nname = \"\"\naddress = \"198.18.0.1\"",
            "targets[0].name",
            &["--target", "=198.18.0.1"],
            "--target",
        ),
        (
            "[[targets]]\nname = \"a/b\"\naddress = \"198.18.0.1\"",
            "targets[0].name",
            &["--target", "a/b=198.18.0.1"],
            "--target",
        ),
        (
            "[[targets]]\nname = \"a\"\naddress = \"nowhere\"",
            "targets[0].address",
            &["--target", "a=nowhere"],
            "--target",
        ),
        (
            "[[targets]]\nname = \"a\"\naddress = \"198.18.0.1\"\n[[targets]]\nname = \"a\"\naddress = \"198.18.0.2\"",
            "targets[1].name",
            &["--target", "a=198.18.0.1", "--target", "a=198.18.0.2"],
            "--target",
        ),
        (
            "[mesh]\ntarget_labels = [\"rack\", \"__x\"]",
            "mesh.target_labels",
            &["--mesh-target-label", "rack", "--mesh-target-label", "__x"],
            "--mesh-target-label",
        ),
        (
            "[mesh]\ntargets_file = \"t.txt\"",
            "mesh.targets_file",
            &["--mesh-targets-file", "t.txt"],
            "--mesh-targets-file",
        ),
        (
            "[mesh]\nlisten = \"nowhere\"",
            "mesh.listen",
            &["--mesh-listen", "nowhere"],
            "--mesh-listen",
        ),
        (
            "[mesh]\nsource = \"nowhere\"",
            "mesh.source",
            &["--mesh-source", "nowhere"],
            "--mesh-source",
        ),
    ];
    for (text, key, flags, flag) in cases {
        let from_file = parse(text).expect_err(text);
        let from_flag = flag_error(flags);
        assert_eq!(
            (from_file.key.as_str(), from_flag.key.as_str()),
            (*key, *flag)
        );
        assert_eq!(from_file.message, from_flag.message, "{text} and {flags:?}");
    }
    // a timeout (the default 2 s) not shorter than the interval: blamed on
    // the timeout, given or not
    let from_file = parse(&format!("{target}interval_seconds = 1")).unwrap_err();
    let from_flag = flag_error(&["--target", "a=198.18.0.1", "--probe-interval", "1"]);
    assert_eq!(
        (from_file.key.as_str(), from_flag.key.as_str()),
        ("targets[0].timeout_seconds", "--probe-timeout")
    );
    assert_eq!(from_file.message, from_flag.message);
    assert_eq!(
        from_flag.message,
        "the step timeout (2s) must be shorter than the interval (1s)"
    );
}
