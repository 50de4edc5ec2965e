//! Every file in `fixtures/invalid/` must fail with exactly the message in its `.expected`.

use std::path::Path;

#[test]
fn each_invalid_fixture_fails_with_its_message() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/invalid");
    let mut checked = 0;
    let mut entries: Vec<_> = std::fs::read_dir(&dir).unwrap().map(|e| e.unwrap().path()).collect();
    entries.sort();
    let bless = std::env::var_os("SANDGATE_BLESS").is_some();
    for path in entries.iter().filter(|p| p.extension().is_some_and(|e| e == "yaml")) {
        let name = path.file_name().unwrap().to_string_lossy().into_owned();
        let src = std::fs::read_to_string(path).unwrap();
        let err = sandgate_policy::CompiledPolicy::from_yaml(&name, &src).expect_err(&name).to_string();
        let expected_path = path.with_extension("expected");
        if bless {
            std::fs::write(&expected_path, format!("{err}\n")).unwrap();
        }
        let expected = std::fs::read_to_string(&expected_path)
            .unwrap_or_else(|_| panic!("{name}: missing {}", expected_path.display()));
        assert_eq!(err, expected.trim_end(), "{name}");
        checked += 1;
    }
    assert!(checked >= 15, "only {checked} fixtures found");
}
