//! A line of input, parsed into a command (CLI.md).

use std::time::Duration;

use ticketing::{Key, Name};

use crate::input::quote;

/// What the input asks for. One line, parsed.
pub(super) enum Line {
    Acquire {
        tag: String,
        key: Key,
        owner: Name,
        wait: Duration,
        lease: Duration,
        /// Renew automatically once granted, for at most this long
        /// (`Some(None)`: with no limit).
        renew: Option<Option<Duration>>,
    },
    Renew {
        acquire: String,
        lease: Option<Duration>,
    },
    AutoRenew {
        acquire: String,
        /// `Some(limit)`: on, for at most `limit`; `None`: off.
        on: Option<Option<Duration>>,
    },
    Release {
        tag: String,
        key: Key,
        token: u64,
    },
    ReleaseGrant {
        tag: String,
        acquire: String,
    },
    Cancel {
        tag: String,
    },
    Abandon {
        tag: String,
    },
    Stats,
    Shutdown {
        budget: Duration,
    },
}

pub(super) fn parse(line: &str) -> Result<Option<Line>, String> {
    let line = line.trim();
    if line.is_empty() || line.starts_with('#') {
        return Ok(None);
    }
    let words: Vec<&str> = line.split_whitespace().collect();
    let want = |n: usize, usage: &str| {
        if words.len() == n {
            Ok(())
        } else {
            Err(format!("usage: {usage}"))
        }
    };
    let tag = |i: usize| -> Result<String, String> {
        Name::new(words[i]).map_err(|e| format!("bad tag {}: {e}", quote(words[i])))?;
        Ok(words[i].to_string())
    };
    let key =
        |i: usize| Key::new(words[i]).map_err(|e| format!("bad key {}: {e}", quote(words[i])));
    let number = |i: usize, what: &str| {
        words[i]
            .parse::<u64>()
            .map_err(|_| format!("bad {what} {}: not a number", quote(words[i])))
    };
    let parsed = match words[0] {
        "acquire" => {
            let usage = "acquire TAG KEY OWNER WAIT_MS LEASE_MS [renew[=UNTIL_MS]]";
            if words.len() != 7 {
                want(6, usage)?;
            }
            let renew = match words.get(6) {
                None => None,
                Some(word) => {
                    Some(switch(word, "renew").ok_or_else(|| format!("usage: {usage}"))??)
                }
            };
            Line::Acquire {
                tag: tag(1)?,
                key: key(2)?,
                owner: Name::new(words[3])
                    .map_err(|e| format!("bad owner {}: {e}", quote(words[3])))?,
                wait: Duration::from_millis(number(4, "WAIT_MS")?),
                lease: Duration::from_millis(number(5, "LEASE_MS")?),
                renew,
            }
        }
        "renew" => {
            let usage = "renew ACQUIRE_TAG [LEASE_MS]";
            if words.len() != 3 {
                want(2, usage)?;
            }
            let lease = match words.get(2) {
                Some(_) => Some(Duration::from_millis(number(2, "LEASE_MS")?)),
                None => None,
            };
            Line::Renew {
                acquire: words[1].to_string(),
                lease,
            }
        }
        "auto-renew" => {
            let usage = "auto-renew ACQUIRE_TAG on[=UNTIL_MS]|off";
            want(3, usage)?;
            let on = match switch(words[2], "on") {
                Some(limit) => Some(limit?),
                None if words[2] == "off" => None,
                None => return Err(format!("usage: {usage}")),
            };
            Line::AutoRenew {
                acquire: words[1].to_string(),
                on,
            }
        }
        "release" => {
            want(4, "release TAG KEY TOKEN")?;
            Line::Release {
                tag: tag(1)?,
                key: key(2)?,
                token: number(3, "TOKEN")?,
            }
        }
        "release-grant" => {
            want(3, "release-grant TAG ACQUIRE_TAG")?;
            Line::ReleaseGrant {
                tag: tag(1)?,
                acquire: words[2].to_string(),
            }
        }
        "cancel" => {
            want(2, "cancel TAG")?;
            Line::Cancel {
                tag: words[1].to_string(),
            }
        }
        "abandon" => {
            want(2, "abandon TAG")?;
            Line::Abandon {
                tag: words[1].to_string(),
            }
        }
        "stats" => {
            want(1, "stats")?;
            Line::Stats
        }
        "shutdown" => {
            want(2, "shutdown BUDGET_MS")?;
            Line::Shutdown {
                budget: Duration::from_millis(number(1, "BUDGET_MS")?),
            }
        }
        other => return Err(format!("unknown command {}", quote(other))),
    };
    Ok(Some(parsed))
}

/// `word` as `NAME` or `NAME=MS`: `None` if it is neither; else the
/// limit it gives (`Ok(None)`: none), or why that limit is bad.
fn switch(word: &str, name: &str) -> Option<Result<Option<Duration>, String>> {
    let rest = word.strip_prefix(name)?;
    if rest.is_empty() {
        return Some(Ok(None));
    }
    let ms = rest.strip_prefix('=')?;
    Some(
        ms.parse::<u64>()
            .map(|ms| Some(Duration::from_millis(ms)))
            .map_err(|_| format!("bad UNTIL_MS {}: not a number", quote(ms))),
    )
}
