// SCAFFOLD (to be replaced by the dropout family).
int main() { return 0; }
