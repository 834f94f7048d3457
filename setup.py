"""Build hook (metadata lives in pyproject.toml): a wheel carries the lm-eval task folder, the configuration
presets and the launch scripts as package data under ``adaponder/_resources/`` (see :mod:`adaponder.resources`),
so ``pip install .`` gives console scripts that work without the repository."""

from pathlib import Path

from setuptools import setup
from setuptools.command.build_py import build_py

ROOT = Path(__file__).resolve().parent
#: wheel folder under adaponder/_resources -> (repository folder, file patterns)
RESOURCES = {
    "eval_tasks": ("eval/tasks", ("*.yaml", "*.py", "*.md")),
    "configs": ("configs", ("**/*.yaml",)),
    "launch": ("launch", ("*.py",)),
}


class build_py_with_resources(build_py):  # noqa: N801 (setuptools command naming)
    def run(self):
        super().run()
        if getattr(self, "editable_mode", False):
            return  # an editable install reads the repository's folders directly
        dest = Path(self.build_lib) / "adaponder" / "_resources"
        for name, (folder, patterns) in RESOURCES.items():
            src = ROOT / folder
            for pattern in patterns:
                for path in sorted(src.glob(pattern)):
                    if path.is_file() and "__pycache__" not in path.parts:
                        target = dest / name / path.relative_to(src)
                        target.parent.mkdir(parents=True, exist_ok=True)
                        self.copy_file(str(path), str(target))


setup(cmdclass={"build_py": build_py_with_resources})
