//! `strftime_now` for chat templates (Llama 3.1 and others stamp the date into the system
//! prompt): the common `strftime` codes over UTC, without a date-time crate.

const MONTHS: [&str; 12] = [
    "January",
    "February",
    "March",
    "April",
    "May",
    "June",
    "July",
    "August",
    "September",
    "October",
    "November",
    "December",
];
const DAYS: [&str; 7] = [
    "Monday",
    "Tuesday",
    "Wednesday",
    "Thursday",
    "Friday",
    "Saturday",
    "Sunday",
];

/// (year, month 1..=12, day 1..=31) of a day count since 1970-01-01 (proleptic Gregorian).
fn civil(days: i64) -> (i64, u32, u32) {
    let z = days + 719_468;
    let era = z.div_euclid(146_097);
    let doe = z.rem_euclid(146_097);
    let yoe = (doe - doe / 1460 + doe / 36_524 - doe / 146_096) / 365;
    let doy = doe - (365 * yoe + yoe / 4 - yoe / 100);
    let mp = (5 * doy + 2) / 153;
    let d = (doy - (153 * mp + 2) / 5 + 1) as u32;
    let m = if mp < 10 { mp + 3 } else { mp - 9 } as u32;
    (yoe + era * 400 + (m <= 2) as i64, m, d)
}

/// `fmt` with `%Y %y %m %d %e %B %b %A %a %j %H %M %S %p %%` filled in for `secs` since the
/// epoch (UTC); other codes are kept as written.
pub fn strftime_utc(fmt: &str, secs: i64) -> String {
    let days = secs.div_euclid(86_400);
    let sod = secs.rem_euclid(86_400);
    let (y, m, d) = civil(days);
    let (h, min, s) = (sod / 3600, sod / 60 % 60, sod % 60);
    let weekday = (days + 3).rem_euclid(7) as usize; // 1970-01-01 was a Thursday
    let yday = days - (civil_days(y, 1, 1)) + 1;
    let mut out = String::with_capacity(fmt.len() + 16);
    let mut chars = fmt.chars();
    while let Some(c) = chars.next() {
        if c != '%' {
            out.push(c);
            continue;
        }
        match chars.next() {
            Some('Y') => out.push_str(&y.to_string()),
            Some('y') => out.push_str(&format!("{:02}", y.rem_euclid(100))),
            Some('m') => out.push_str(&format!("{m:02}")),
            Some('d') => out.push_str(&format!("{d:02}")),
            Some('e') => out.push_str(&format!("{d:>2}")),
            Some('B') => out.push_str(MONTHS[m as usize - 1]),
            Some('b') => out.push_str(&MONTHS[m as usize - 1][..3]),
            Some('A') => out.push_str(DAYS[weekday]),
            Some('a') => out.push_str(&DAYS[weekday][..3]),
            Some('j') => out.push_str(&format!("{yday:03}")),
            Some('H') => out.push_str(&format!("{h:02}")),
            Some('M') => out.push_str(&format!("{min:02}")),
            Some('S') => out.push_str(&format!("{s:02}")),
            Some('p') => out.push_str(if h < 12 { "AM" } else { "PM" }),
            Some('%') => out.push('%'),
            Some(other) => {
                out.push('%');
                out.push(other);
            }
            None => out.push('%'),
        }
    }
    out
}

/// Days since 1970-01-01 of a civil date.
fn civil_days(y: i64, m: u32, d: u32) -> i64 {
    let y = y - (m <= 2) as i64;
    let era = y.div_euclid(400);
    let yoe = y.rem_euclid(400);
    let mp = (m as i64 + 9) % 12;
    let doy = (153 * mp + 2) / 5 + d as i64 - 1;
    let doe = yoe * 365 + yoe / 4 - yoe / 100 + doy;
    era * 146_097 + doe - 719_468
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn known_dates() {
        assert_eq!(strftime_utc("%d %b %Y", 0), "01 Jan 1970");
        // 2026-11-24 12:34:56 UTC, a Tuesday, day 328.
        let t = 1_795_523_696;
        assert_eq!(strftime_utc("%Y-%m-%d %H:%M:%S", t), "2026-11-24 12:34:56");
        assert_eq!(
            strftime_utc("%A %a %B %j %p %%", t),
            "Tuesday Tue November 328 PM %"
        );
        // Leap day, and the round trip of the day count.
        assert_eq!(
            strftime_utc("%d %B %Y", civil_days(2024, 2, 29) * 86_400),
            "29 February 2024"
        );
        for days in [-1000, 0, 59, 60, 10_000, 20_000, 30_000] {
            let (y, m, d) = civil(days);
            assert_eq!(civil_days(y, m, d), days);
        }
    }
}
