//! Chat templates render in a child process (Linux, Android): a host program that ignores
//! SIGCHLD (its children are reaped for it, so no exit status can be read) still gets whole
//! results, and hostile templates still end in errors. Its own test binary: the signal
//! disposition is process-wide.

#[cfg(any(target_os = "linux", target_os = "android"))]
#[test]
fn renders_survive_a_host_that_ignores_sigchld() {
    use pi2_model::chat::CHATML;
    use pi2_model::{ChatTemplate, Message};
    // SAFETY: setting a signal disposition; no handler runs.
    unsafe { libc::signal(libc::SIGCHLD, libc::SIG_IGN) };
    let msgs = [Message::new("user", "hi")];
    let t = ChatTemplate::new(CHATML, "", "").unwrap();
    for _ in 0..20 {
        assert_eq!(
            t.render(&msgs, true).unwrap(),
            "<|im_start|>user\nhi<|im_end|>\n<|im_start|>assistant\n"
        );
    }
    let doubling = format!(
        "{{% set s = 'xy' %}}{}{{{{ s|length }}}}",
        "{% set s = s ~ s %}".repeat(40)
    );
    let err = ChatTemplate::new(&doubling, "", "")
        .unwrap()
        .render(&msgs, true)
        .unwrap_err();
    assert!(err.to_string().contains("needed more than"), "{err}");
}
