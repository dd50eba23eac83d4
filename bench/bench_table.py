"""A table of strings printed as aligned columns or as Markdown (the bench scripts' output)."""


def print_table(head, rows, markdown):
    if markdown:
        print("| " + " | ".join(head) + " |")
        print("|" + "---|" * len(head))
        for row in rows:
            print("| " + " | ".join(row) + " |")
    else:
        widths = [max(len(str(x)) for x in col) for col in zip(head, *rows)]
        for row in [head, *rows]:
            print("  ".join(str(x).ljust(w) for x, w in zip(row, widths)).rstrip())
