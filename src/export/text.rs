//! A drawn screen as text: plain, or with ANSI colours.

use ratatui_core::buffer::Buffer;
use ratatui_core::style::{Color, Modifier};

fn sgr_fg(c: Color) -> Option<String> {
    Some(match c {
        Color::Reset => return None,
        Color::Black => "30".into(),
        Color::Red => "31".into(),
        Color::Green => "32".into(),
        Color::Yellow => "33".into(),
        Color::Blue => "34".into(),
        Color::Magenta => "35".into(),
        Color::Cyan => "36".into(),
        Color::Gray => "37".into(),
        Color::DarkGray => "90".into(),
        Color::LightRed => "91".into(),
        Color::LightGreen => "92".into(),
        Color::LightYellow => "93".into(),
        Color::LightBlue => "94".into(),
        Color::LightMagenta => "95".into(),
        Color::LightCyan => "96".into(),
        Color::White => "97".into(),
        Color::Indexed(i) => format!("38;5;{i}"),
        Color::Rgb(r, g, b) => format!("38;2;{r};{g};{b}"),
    })
}

/// Every row of `buf`, trailing blanks trimmed; with `ansi`, colour and
/// bold/reverse as SGR sequences, reset at each line's end.
pub(crate) fn from_buffer(buf: &Buffer, ansi: bool) -> String {
    let a = buf.area;
    let mut out = String::new();
    for y in a.top()..a.bottom() {
        let mut line = String::new();
        let mut cur: Option<String> = None;
        for x in a.left()..a.right() {
            let c = &buf[(x, y)];
            if ansi {
                let mut codes = Vec::new();
                if c.modifier.contains(Modifier::BOLD) {
                    codes.push("1".to_string());
                }
                if c.modifier.contains(Modifier::REVERSED) {
                    codes.push("7".to_string());
                }
                codes.extend(sgr_fg(c.fg));
                let want = if codes.is_empty() { None } else { Some(codes.join(";")) };
                if want != cur {
                    line.push_str("\x1b[0m");
                    if let Some(w) = &want {
                        line.push_str(&format!("\x1b[{w}m"));
                    }
                    cur = want;
                }
            }
            line.push_str(c.symbol());
        }
        if ansi {
            line.push_str("\x1b[0m");
        } else {
            line.truncate(line.trim_end().len());
        }
        out.push_str(&line);
        out.push('\n');
    }
    out
}
