//! `pi2 chat` on a pseudo-terminal, as a person types: arrow keys recall history (never typed
//! as `^[[A`), Ctrl-C stops a reply and the conversation goes on, `/help` is not sent to the
//! model, `/system`, `/save` and `/load` work, Ctrl-D leaves.

mod common;

use common::m;
use rexpect::session::spawn_command;
use std::process::Command;

/// Types `text` and Enter (a terminal sends a carriage return), after a pause in which the
/// line editor finishes drawing its prompt (keys typed before it is ready may be flushed).
fn line(p: &mut rexpect::session::PtySession, text: &str) {
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send(&format!("{text}\r")).unwrap();
    p.flush().unwrap();
}

#[test]
fn the_terminal_chat_edits_lines_stops_replies_and_keeps_the_conversation() {
    let dir = tempfile::tempdir().unwrap();
    let saved = dir.path().join("conv.json");
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_pi2"));
    // Replies long enough (4000 tokens) that Ctrl-C always lands inside one, on any CPU.
    cmd.args(["chat", "-m", &m(), "--temp", "0", "-n", "4000", "-t", "2"]);
    cmd.current_dir(common::root());
    let mut p = spawn_command(cmd, Some(60_000)).unwrap();
    p.exp_string("/help lists commands").unwrap();
    p.exp_string("> ").unwrap();
    // /help is answered by pi2, not sent to the model.
    line(&mut p, "/help");
    p.exp_string("/save FILE").unwrap();
    p.exp_string("> ").unwrap();
    line(&mut p, "/system You are a pirate.");
    p.exp_string("(system prompt set)").unwrap();
    p.exp_string("> ").unwrap();
    // A long reply, stopped with Ctrl-C: pi2 says so and asks for the next line.
    line(&mut p, "Write a very long story about the sea.");
    std::thread::sleep(std::time::Duration::from_millis(1500));
    p.send_control('c').unwrap();
    p.exp_string("(stopped)").unwrap();
    p.exp_string("> ").unwrap();
    // Up recalls the last line; it is sent again (the conversation now has two user turns).
    std::thread::sleep(std::time::Duration::from_millis(300));
    p.send("\x1b[A").unwrap();
    p.flush().unwrap();
    p.exp_string("Write a very long story about the sea.")
        .unwrap();
    p.send_control('c').unwrap(); // Ctrl-C at the prompt clears the line, pi2 stays.
    p.exp_string("Ctrl-D or /exit leaves").unwrap();
    line(&mut p, &format!("/save {}", saved.display()));
    p.exp_string("(saved)").unwrap();
    line(&mut p, &format!("/save {}", saved.display()));
    p.exp_string("never replaced").unwrap();
    line(&mut p, "/nonsense");
    p.exp_string("unknown command `/nonsense`").unwrap();
    line(&mut p, "/reset");
    p.exp_string("(conversation cleared)").unwrap();
    line(&mut p, &format!("/load {}", saved.display()));
    p.exp_string("(loaded)").unwrap();
    p.send_control('d').unwrap();
    p.exp_eof().unwrap();
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&saved).unwrap()).unwrap();
    let msgs = v["messages"].as_array().unwrap();
    assert_eq!(msgs[0]["role"], "system");
    assert_eq!(msgs[0]["content"], "You are a pirate.");
    assert_eq!(msgs[1]["content"], "Write a very long story about the sea.");
    assert_eq!(msgs[2]["role"], "assistant");
    assert!(!msgs[2]["content"].as_str().unwrap().is_empty());
    assert!(!msgs
        .iter()
        .any(|m| m["content"].as_str().unwrap().contains("/help")));
}
