"""`python -m gpt.commands.hardware`: the DeepSpeed config a CPU run should use on this machine (stdout), and why (stderr)."""
import sys

from gpt.config.hardware import cpu_bf16_units, cpu_ds_config


def main():
    fast, why = cpu_bf16_units()
    print(cpu_ds_config())
    print(f"{why}: {'bf16 units present' if fast else 'no bf16 units, bf16 would be emulated'}", file=sys.stderr)


if __name__ == "__main__":
    main()
