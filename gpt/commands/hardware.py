"""`python -m gpt.commands.hardware`: the DeepSpeed config a CPU run should use on this machine (stdout), and why (stderr)."""
import sys

from gpt.config.hardware import cpu_bf16_slowdown, cpu_ds_config, cpu_has_fast_bf16


def main():
    slowdown = cpu_bf16_slowdown()
    print(cpu_ds_config())
    print(f"bf16 matmul {slowdown:.2f}x the time of fp32 on this CPU (measured): "
          f"{'bf16 units present' if cpu_has_fast_bf16() else 'no bf16 units, bf16 would be emulated'}",
          file=sys.stderr)


if __name__ == "__main__":
    main()
