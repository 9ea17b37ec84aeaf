#!/usr/bin/env python3
"""Tests of switch.py: python3 -m unittest discover -s conformance -p 'test_*.py'"""
import os
import subprocess
import sys
import tempfile
import unittest
from pathlib import Path

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from switch import switch  # noqa: E402


class Switch(unittest.TestCase):
    def check(self, before, after):
        self.assertEqual(switch(before), after)
        self.assertEqual(switch(after), after, "switching twice changes nothing more")

    def test_plain_paths(self):
        self.check(
            "tokio::time::sleep(Duration::from_millis(5)).await;\n"
            "let t = ::tokio::time::Instant::now();\n",
            "sharded_timer::time::sleep(Duration::from_millis(5)).await;\n"
            "let t = ::sharded_timer::time::Instant::now();\n",
        )

    def test_use_forms(self):
        self.check("use tokio::time::{self, Duration};\n", "use sharded_timer::time::{self, Duration};\n")
        self.check("use tokio::time;\n", "use sharded_timer::time;\n")
        self.check("use tokio::time::*;\n", "use sharded_timer::time::*;\n")
        self.check("use tokio::time::Instant as TInstant;\n", "use sharded_timer::time::Instant as TInstant;\n")
        self.check("pub use tokio::time::error::Elapsed;\n", "pub use sharded_timer::time::error::Elapsed;\n")

    def test_nested_group(self):
        self.check(
            "use tokio::{sync::oneshot, time::{Duration, Instant}};\n",
            "use tokio::{sync::oneshot};\nuse sharded_timer::time::{Duration, Instant};\n",
        )

    def test_group_with_time_module(self):
        self.check("use tokio::{time, sync};\n", "use tokio::{sync};\nuse sharded_timer::time;\n")
        self.check("    use tokio::{task, time};\n", "    use tokio::{task};\n    use sharded_timer::time;\n")
        self.check("use tokio::{time};\n", "use sharded_timer::time;\n")
        self.check(
            "pub(crate) use tokio::{time::sleep, time::Sleep};\n",
            "pub(crate) use sharded_timer::{time::sleep, time::Sleep};\n",
        )

    def test_multiline_group(self):
        self.check(
            "use tokio::{\n    net::TcpStream,\n    time::{sleep, Duration},\n};\nfn f() {}\n",
            "use tokio::{net::TcpStream};\nuse sharded_timer::time::{sleep, Duration};\nfn f() {}\n",
        )

    def test_group_without_time_is_kept(self):
        for src in ("use tokio::{pin, select};\n", "use tokio::{task, sync::mpsc, timeout_x};\n"):
            self.check(src, src)

    def test_doc_comments(self):
        self.check(
            "/// ```\n/// use tokio::time::{self, Duration};\n/// tokio::time::sleep(d).await;\n/// ```\n",
            "/// ```\n/// use sharded_timer::time::{self, Duration};\n/// sharded_timer::time::sleep(d).await;\n/// ```\n",
        )
        self.check(
            "    /// use tokio::{sync::oneshot, time::{Duration, Instant}};\n    fn f() {}\n",
            "    /// use tokio::{sync::oneshot};\n    /// use sharded_timer::time::{Duration, Instant};\n    fn f() {}\n",
        )
        self.check("//! use tokio::{time, task};\n", "//! use tokio::{task};\n//! use sharded_timer::time;\n")

    def test_other_tokio_paths_untouched(self):
        src = (
            "#[tokio::test(start_paused = true)]\n"
            "#[tokio::main(flavor = \"current_thread\")]\n"
            "use tokio::runtime::Runtime;\nuse tokio::sync::oneshot;\n"
            "tokio::spawn(async {});\ntokio::pin!(s);\ntokio::task::yield_now().await;\n"
            "tokio::time_budget(); my::tokio::time::x();\n"
        )
        self.check(src, src)

    def test_command_rewrites_files_in_place(self):
        with tempfile.TemporaryDirectory() as d:
            (Path(d) / "a").mkdir()
            (Path(d) / "a" / "t.rs").write_text("use tokio::time::sleep;\n")
            (Path(d) / "b.txt").write_text("use tokio::time::sleep;\n")
            script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "switch.py")
            subprocess.run([sys.executable, script, d], check=True, capture_output=True)
            self.assertEqual((Path(d) / "a" / "t.rs").read_text(), "use sharded_timer::time::sleep;\n")
            self.assertEqual((Path(d) / "b.txt").read_text(), "use tokio::time::sleep;\n")


if __name__ == "__main__":
    unittest.main()
