//! The AWS shared files, as the AWS CLI reads them, for what `object_store` does not read:
//! `~/.aws/credentials` and `~/.aws/config` (or `AWS_SHARED_CREDENTIALS_FILE` /
//! `AWS_CONFIG_FILE`), profile `AWS_PROFILE` or `default`. Static keys, a session token, the
//! region and `endpoint_url` only (no SSO, no `credential_process`, no role chaining).
//! The `AWS_*` variables win over the files, as for the CLI: the caller applies these first.

use std::path::PathBuf;

/// `(setting, value)` pairs of the profile, named as the `AWS_*` variable each stands for.
pub(crate) fn settings(env: &dyn Fn(&str) -> Option<String>) -> Vec<(&'static str, String)> {
    let profile = env("AWS_PROFILE").unwrap_or_else(|| "default".into());
    let home = env("HOME").map(PathBuf::from).unwrap_or_default();
    let file = |var: &str, name: &str| {
        env(var).map_or_else(|| home.join(".aws").join(name), PathBuf::from)
    };
    let credentials = read(&file("AWS_SHARED_CREDENTIALS_FILE", "credentials"));
    let config = read(&file("AWS_CONFIG_FILE", "config"));
    let config_section = match profile.as_str() {
        "default" => "default".to_string(),
        p => format!("profile {p}"),
    };
    let mut out = Vec::new();
    let keys = [
        ("aws_access_key_id", "AWS_ACCESS_KEY_ID"),
        ("aws_secret_access_key", "AWS_SECRET_ACCESS_KEY"),
        ("aws_session_token", "AWS_SESSION_TOKEN"),
        ("region", "AWS_REGION"),
        ("endpoint_url", "AWS_ENDPOINT_URL"),
    ];
    for (key, var) in keys {
        let value = section_value(&credentials, &profile, key)
            .or_else(|| section_value(&config, &config_section, key));
        if let Some(value) = value {
            out.push((var, value));
        }
    }
    out
}

fn read(path: &std::path::Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `key`'s value in `[section]` of an INI text, if any.
fn section_value(text: &str, section: &str, key: &str) -> Option<String> {
    let mut inside = false;
    for line in text.lines().map(str::trim) {
        if let Some(name) = line.strip_prefix('[').and_then(|l| l.strip_suffix(']')) {
            inside = name.trim() == section;
        } else if inside
            && let Some((k, v)) = line.split_once('=')
            && k.trim() == key
        {
            return Some(v.trim().to_string());
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_profile_reads_credentials_then_config() {
        let dir = tempfile::tempdir().unwrap();
        let creds = dir.path().join("credentials");
        let config = dir.path().join("config");
        std::fs::write(&creds, "[default]\naws_access_key_id = D\n[lab]\naws_access_key_id = L\naws_secret_access_key=S\n").unwrap();
        std::fs::write(&config, "[default]\nregion = eu-west-1\n[profile lab]\nregion = us-west-2\nendpoint_url = http://minio:9000\n").unwrap();
        let env = |profile: Option<&'static str>| {
            let (creds, config) = (creds.clone(), config.clone());
            move |var: &str| match var {
                "AWS_PROFILE" => profile.map(String::from),
                "AWS_SHARED_CREDENTIALS_FILE" => Some(creds.display().to_string()),
                "AWS_CONFIG_FILE" => Some(config.display().to_string()),
                _ => None,
            }
        };
        let got = settings(&env(Some("lab")));
        assert_eq!(
            got,
            [
                ("AWS_ACCESS_KEY_ID", "L".to_string()),
                ("AWS_SECRET_ACCESS_KEY", "S".to_string()),
                ("AWS_REGION", "us-west-2".to_string()),
                ("AWS_ENDPOINT_URL", "http://minio:9000".to_string()),
            ]
        );
        let got = settings(&env(None));
        assert_eq!(
            got,
            [
                ("AWS_ACCESS_KEY_ID", "D".to_string()),
                ("AWS_REGION", "eu-west-1".to_string()),
            ]
        );
    }
}
